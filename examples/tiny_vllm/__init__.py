"""The tiny model and its vLLM: what `agl demo`, the examples, the tests and the benchmarks run on a CPU, offline."""
