"""The sglang adapter: drives a pinned upstream release (in its own venv, .venv-sglang-VERSION)
through the operation vocabulary, in a subprocess served by run_trace."""
