"""Building and keeping an index: settings, the build pipeline, Ray workers, tuning, rm/check,
and watch mode."""
