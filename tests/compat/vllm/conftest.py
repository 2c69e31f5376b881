# vLLM's own test files, vendored: run only by tests/compat/test_vllm_suite.py, each in a fresh
# interpreter with the vllm_suite plugin (they import vllm, which this repository stands in for).
collect_ignore_glob = ["test_*.py"]
