"""The tiny model and its vLLM: what the demo, the examples, the tests and the benchmarks run on a CPU, offline."""
