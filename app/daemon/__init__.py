"""The per-user daemon transport: where its socket lives, the daemon itself, its light client, the
command server the console script hands commands to, and the request the CLI answers in its own
process where no daemon can be had."""
