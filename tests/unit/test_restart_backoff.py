"""A unit that heals for its whole life (issue 51): no start limit, a restart delay of at least a second, and the
delay's growth reset by a timer on the node once the service has been healthy (systemd never resets it itself)."""

import pytest
from pydantic import ValidationError

from deploys.service.backoff import check_every_s, render_service, render_timer
from deploys.service.unit import render_container, unit_sections
from deploys.schema import NodeConfig
from files.inference_service.backoff_reset import reset_due
from tests.unit.profiles import profile


def cfg(**changes) -> NodeConfig:
    return NodeConfig.model_validate({**profile("rtx_pro_6000_pair"), **changes})


HOUR_US = 3600 * 10**6


@pytest.mark.parametrize("state, now, due", [
    ({"ActiveState": "active", "NRestarts": "3", "ActiveEnterTimestampMonotonic": str(HOUR_US)}, 3600 + 600, True),
    ({"ActiveState": "active", "NRestarts": "3", "ActiveEnterTimestampMonotonic": str(HOUR_US)}, 3600 + 599, False),
    ({"ActiveState": "active", "NRestarts": "0", "ActiveEnterTimestampMonotonic": str(HOUR_US)}, 9999, False),
    ({"ActiveState": "activating", "NRestarts": "3", "ActiveEnterTimestampMonotonic": str(HOUR_US)}, 9999, False),
    ({"ActiveState": "failed", "NRestarts": "5", "ActiveEnterTimestampMonotonic": str(HOUR_US)}, 9999, False),
    ({"ActiveState": "active", "NRestarts": "3", "ActiveEnterTimestampMonotonic": "0"}, 9999, False),
    ({"ActiveState": "active", "NRestarts": "", "ActiveEnterTimestampMonotonic": str(HOUR_US)}, 9999, False),
    ({}, 9999, False),
])
def test_the_backoff_resets_only_after_a_healthy_stretch_that_followed_self_heals(state, now, due):
    assert reset_due(state, now, 600) is due


def test_the_unit_restarts_for_its_whole_life_and_a_timer_resets_the_growing_delay():
    c = cfg()
    unit = unit_sections(render_container(c))
    assert ("StartLimitIntervalSec", "0") in unit["Unit"], "a start limit would stop the unit for good"
    service = dict(unit["Service"])
    assert (service["Restart"], service["RestartSec"], service["RestartSteps"]) == ("always", "30", "5")
    assert dict(unit_sections(render_service(c))["Service"])["ExecStart"].endswith(
        "backoff_reset.py --service grandpa.service --healthy-after 600")
    timer = dict(unit_sections(render_timer(c))["Timer"])
    assert timer["OnUnitActiveSec"] == timer["OnBootSec"] == "150s"
    assert [check_every_s(cfg(service_backoff_reset_after_s=s)) for s in (30, 600, 86400)] == [10, 150, 300]


@pytest.mark.parametrize("key, value", [("service_restart_sec", 0), ("service_backoff_reset_after_s", 29)])
def test_a_restart_without_delay_or_a_reset_within_seconds_is_refused(key, value):
    with pytest.raises(ValidationError, match=key):
        cfg(**{key: value})
