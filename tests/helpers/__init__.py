"""Code the tests share: helpers and test doubles, imported by test modules and conftest.py.

A test module never imports another test module (tests/test_test_imports.py checks it): what
two test files need goes here, or into a fixture in conftest.py. pytest puts tests/ on the
import path (pyproject's `pythonpath`), so these are imported as `helpers.<module>`.
"""
