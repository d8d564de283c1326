"""Code the test files share, imported as `helpers.<module>` (pyproject.toml puts tests/ on sys.path): tiny models and
checks on tied models (`models`), a tiny trainer (`training`), run_clm.py settings (`scripts`), several processes
(`processes`) and a Hub on localhost (`hub_server`). Shared pytest fixtures are in tests/conftest.py, not here; test
files import from no other test file."""
