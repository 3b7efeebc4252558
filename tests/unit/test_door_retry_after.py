"""What a closed door tells its clients (`Retry-After`, issue 51): how long the switch may still take, judged by how
long the head's last switch kept the door closed, counted down while the converge waits; and the shell that keeps
the door's flag and hint files on the node, run here in a scratch folder."""

import subprocess

import pytest

from deploys.endpoint import CLOSED_DIR, RETRY_AFTER_S, RETRY_AFTER_STEPS, closed_flag_path, retry_hint_paths
from deploys.schema import NodeConfig
from deploys.service.door import (door_close_command, door_closed_at_command, door_open_command, door_tells_command,
                                  parse_door_closed, retry_after_s)
from tests.unit.profiles import profile


def cfg() -> NodeConfig:
    return NodeConfig.model_validate(profile("rtx_pro_6000_pair"))


@pytest.mark.parametrize("expected, elapsed, told", [
    (None, 0, RETRY_AFTER_S),      # no switch timed before: it cannot say
    (150, 0, 60),                  # a long switch ahead: at most 60 s (the door tells again then)
    (150, 89, 60),                 # 61 s left
    (150, 90, 60),                 # 60 s left
    (150, 91, 60),                 # 59 s left: rounded up to the next step
    (150, 120, 30),
    (150, 131, 20),
    (150, 136, 15),
    (150, 141, 10),
    (150, 145.5, 5),
    (150, 149.9, 5),
    (150, 150, RETRY_AFTER_S),     # ran as long as the last one: it cannot say any more
    (150, 400, RETRY_AFTER_S),
    (12, 0, 15),
    (3, 0, 5),                     # never less than 5 s
    (0, 0, RETRY_AFTER_S),
    (-5, 0, RETRY_AFTER_S),
    ("150", 0, RETRY_AFTER_S),     # a record that is not a number
])
def test_the_closed_door_tells_how_long_the_switch_may_still_take(expected, elapsed, told):
    assert retry_after_s(expected, elapsed) == told


def test_every_figure_the_door_tells_is_a_step_it_has_a_hint_for():
    told = {retry_after_s(e, t) for e in (None, 1, 7, 33, 59, 61, 200, 3600) for t in range(0, 3700, 3)}
    assert told <= set(RETRY_AFTER_STEPS) and RETRY_AFTER_S in RETRY_AFTER_STEPS
    assert max(told) == 60 and min(told) == 5


def _sh(command: str, where) -> str:
    out = subprocess.run(["sh", "-c", command.replace(CLOSED_DIR, str(where))], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_door_closes_with_its_hint_counts_down_and_opens_leaving_nothing(tmp_path):
    c = cfg()
    flag = closed_flag_path(c).replace(CLOSED_DIR, str(tmp_path))
    hints = [p.replace(CLOSED_DIR, str(tmp_path)) for p in retry_hint_paths(c)]
    assert parse_door_closed(_sh(door_closed_at_command(c), tmp_path)) == (None, None)  # open

    _sh(door_close_command(c, 150.4), tmp_path)
    assert [h.rsplit("-", 1)[1] for h in hints if (tmp_path / h.rsplit("/", 1)[1]).exists()] == ["60"]
    closed_s, expected = parse_door_closed(_sh(door_closed_at_command(c), tmp_path))
    assert expected == 150 and 0 <= closed_s < 5

    _sh(door_tells_command(c, 15), tmp_path)  # the new hint in place, the old one gone
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([flag.rsplit("/", 1)[1], f"{c.container_name}.retry-after-15"])

    _sh(door_close_command(c, None), tmp_path)  # closed again, no switch timed: it tells the default
    assert parse_door_closed(_sh(door_closed_at_command(c), tmp_path))[1] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([flag.rsplit("/", 1)[1], f"{c.container_name}.retry-after-{RETRY_AFTER_S}"])

    _sh(door_open_command(c), tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("out, parsed", [
    ("1000\n150\n1042\n", (42.0, 150.0)),
    ("1000\n\n1042\n", (42.0, None)),        # closed before the door was timed (or by an older converge)
    ("1000\nxyz\n1042\n", (42.0, None)),
    ("1042\n", (None, None)),                 # open
    ("1000\n150\n990\n", (0.0, 150.0)),      # a clock stepped back: not negative
    ("", (None, None)),
])
def test_what_the_wait_reads_of_the_door(out, parsed):
    assert parse_door_closed(out) == parsed
