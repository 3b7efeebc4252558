"""The cheaper per-operation-call work (deploys/op_overhead.py) gives exactly what pyinfra's own does, and
is what pyinfra uses once the deploys are imported."""

import importlib
import types

import pytest
from pyinfra.api import arguments as pyinfra_arguments
from pyinfra.api import facts as pyinfra_facts

from deploys import op_overhead  # importing the package installs it

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


def _run_deploy(path, state):
    results = []

    def probe():  # both from the same caller frame and line, so their numbers must agree
        results.append((op_overhead._PYINFRA_ORDER(state), op_overhead.operation_order_from_stack(state)))

    exec(compile(DEPLOY, str(path), "exec"), {"probe": probe})
    return results


@pytest.mark.parametrize("is_cli", [True, False])
@pytest.mark.parametrize("deploy_named", [True, False])
def test_operation_order_is_pyinfras_own(tmp_path, monkeypatch, is_cli, deploy_named):
    path = tmp_path / "deploy.py"
    path.write_text(DEPLOY)
    monkeypatch.setattr("pyinfra.is_cli", is_cli)
    state = types.SimpleNamespace(current_deploy_filename=str(path) if deploy_named else None,
                                  current_op_file_number=7)
    results = _run_deploy(path, state)
    assert len(results) == 5
    for pyinfras, ours in results:
        assert ours == pyinfras
    if deploy_named:  # the numbers start at the deploy file's line of the call (line 15: `results = ...`)
        assert results[0][1][:2] == ([7, 15] if is_cli else [15, 11])
    assert len({tuple(ours) for _, ours in results}) > 1, "different call sites must give different orders"


def test_global_arguments_are_pyinfras_own_and_computed_once():
    assert op_overhead.all_global_arguments() == op_overhead._PYINFRA_ARGUMENTS()
    assert op_overhead.all_global_arguments() is not op_overhead.all_global_arguments(), "callers get a fresh list"
    op_overhead.all_global_arguments().clear()
    assert op_overhead.all_global_arguments() == op_overhead._PYINFRA_ARGUMENTS()


def test_pyinfra_uses_them_once_the_deploys_are_imported():
    operation_module = importlib.import_module("pyinfra.api.operation")
    assert operation_module.get_operation_order_from_stack is op_overhead.operation_order_from_stack
    assert pyinfra_arguments.all_global_arguments is op_overhead.all_global_arguments
    assert pyinfra_facts.all_global_arguments is op_overhead.all_global_arguments
