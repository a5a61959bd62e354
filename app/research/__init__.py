"""Research tools over the library: retrieval and STS evaluation, benchmarks, layer calibration's
text gathering, metrics and plots. They use ``app.Index`` and the engine; the engine never uses them."""
