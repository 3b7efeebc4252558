"""The cheaper per-operation-call work (deploys/run/op_overhead.py) gives exactly what pyinfra's own does, and
is what pyinfra uses once the deploys are imported."""

import inspect
import os
import types

import pytest
from pyinfra.api import arguments as pyinfra_arguments
from pyinfra.api import facts as pyinfra_facts
from pyinfra.api import util as pyinfra_util

from deploys.run import op_overhead  # importing the package installs it

# a deploy file: operations called from nested helpers, over several lines, at several depths
DEPLOY = '''
def op():
    return probe()


def helper(depth):
    if depth:
        return helper(
            depth - 1,
        )
    return (op(
    ), op())


results = [helper(0), helper(2)]
results.append(op())
'''


def _run_deploy(path, state, monkeypatch):
    results = []

    def answers(pyinfras_own: bool):
        with monkeypatch.context() as m:
            if pyinfras_own:  # the inspect functions pyinfra's util module imported
                m.setattr(pyinfra_util, "stack", inspect.stack)
                m.setattr(pyinfra_util, "getframeinfo", inspect.getframeinfo)
            return pyinfra_util.get_operation_order_from_stack(state), pyinfra_util.get_call_location(3)

    def probe():  # both from the same frames, so their answers must agree
        results.append(tuple(answers(pyinfras_own) for pyinfras_own in (True, False)))

    exec(compile(DEPLOY, str(path), "exec"), {"probe": probe})
    return results


@pytest.mark.parametrize("is_cli", [True, False])
@pytest.mark.parametrize("deploy_named", [True, False])
def test_operation_order_and_call_location_are_pyinfras_own(tmp_path, monkeypatch, is_cli, deploy_named):
    path = tmp_path / "deploy.py"
    path.write_text(DEPLOY)
    monkeypatch.setattr("pyinfra.is_cli", is_cli)
    state = types.SimpleNamespace(current_deploy_filename=str(path) if deploy_named else None,
                                  current_op_file_number=7)
    results = _run_deploy(path, state, monkeypatch)
    assert len(results) == 5
    for pyinfras, ours in results:
        assert ours == pyinfras
    (order, location), _ = results[0]
    if deploy_named:  # the numbers start at the deploy file's line of the call (line 15: `results = ...`)
        assert order[:2] == ([7, 15] if is_cli else [15, 11])
    assert location == f"line 3 in {os.path.relpath(path)}", location  # where probe() was called: op()
    assert len({tuple(ours[0]) for _, ours in results}) > 1, "different call sites must give different orders"


def test_global_arguments_are_pyinfras_own_and_computed_once():
    assert op_overhead.all_global_arguments() == op_overhead._PYINFRA_ARGUMENTS()
    assert op_overhead.all_global_arguments() is not op_overhead.all_global_arguments(), "callers get a fresh list"
    op_overhead.all_global_arguments().clear()
    assert op_overhead.all_global_arguments() == op_overhead._PYINFRA_ARGUMENTS()


def test_pyinfra_uses_them_once_the_deploys_are_imported():
    assert pyinfra_util.stack is op_overhead.stack_without_source
    assert pyinfra_util.getframeinfo is op_overhead.frameinfo_without_source
    assert pyinfra_arguments.all_global_arguments is op_overhead.all_global_arguments
    assert pyinfra_facts.all_global_arguments is op_overhead.all_global_arguments
