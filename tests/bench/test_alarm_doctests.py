"""The examples in the docstrings of the alarm benchmark's oracle and simulation hold (the test command's
``--doctest-modules calibkit training tests`` does not reach bench/; calibkit.synthetic's run there)."""

import doctest

import pytest

from bench.alarm import oracle, simulation


@pytest.mark.parametrize("module", [oracle, simulation], ids=lambda module: module.__name__)
def test_the_docstring_examples_hold(module):
    failed, attempted = doctest.testmod(module)
    assert attempted > 0 and failed == 0
