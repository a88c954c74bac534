"""The examples in the docstrings of the alarm benchmark's oracle, simulation and traffic hold (the test command's
``--doctest-modules calibkit training tests`` does not reach bench/)."""

import doctest

import pytest

from bench.alarm import oracle, simulation, traffic


@pytest.mark.parametrize("module", [oracle, simulation, traffic], ids=lambda module: module.__name__)
def test_the_docstring_examples_hold(module):
    failed, attempted = doctest.testmod(module)
    assert attempted > 0 and failed == 0
