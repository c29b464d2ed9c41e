"""A worker killed by a signal is classified by the evidence (diagnose/kill_cause.py, kill_witness.py)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from stalwart.diagnose.incident import Component, FaultClass
from stalwart.diagnose.kill_cause import KillEvidence, classify_kill, load_kill_rules, oom_lines_for
from stalwart.diagnose.kill_witness import KillWitness, memory_counter_file, read_oom_kills
from stalwart.diagnose.root_cause import component_class, incident_class
from stalwart.errors import ConfigError
from stalwart.launch.attempt.monitors import crash
from stalwart.launch.snapshot import RankView, Snapshot

KILLS = Path(__file__).parents[1] / "fixtures" / "diagnose" / "kills"
T0 = 1_000.0


def lines(name: str) -> list[str]:
    return (KILLS / name).read_text().splitlines()


def test_recorded_memcg_oom_lines_name_the_pid_and_only_it():
    found = oom_lines_for(13606, lines("dmesg_memcg_oom.txt"))
    assert len(found) == 2  # the oom-kill: summary and the "Killed process" line
    assert all("13606" in x for x in found)
    assert oom_lines_for(13607, lines("dmesg_memcg_oom.txt")) == ()
    assert len(oom_lines_for(48211, lines("dmesg_global_oom.txt"))) == 2


def test_sigkill_with_a_kernel_oom_line_is_a_memory_incident_with_the_rss():
    ev = KillEvidence(
        rank=1, pid=13606, signum=signal.SIGKILL, oom_lines=oom_lines_for(13606, lines("dmesg_memcg_oom.txt"))
    )
    v = classify_kill(ev)
    assert v is not None and v.rule == "kernel-oom-killer"
    assert "killed by the kernel OOM killer" in v.cause
    assert "64 MiB" in v.cause  # anon-rss:65280kB from the kernel's own line
    assert (v.fault_class, v.component) == (FaultClass.USER, Component.HOST_MEMORY)
    assert any("Killed process 13606" in x for x in v.evidence)


def test_the_sampled_rss_wins_over_the_kernel_line():
    ev = KillEvidence(rank=0, pid=1, signum=signal.SIGKILL, cgroup_oom_kills=1, rss_kb=3 * 1024 * 1024)
    v = classify_kill(ev)
    assert v is not None and v.component is Component.HOST_MEMORY and "3,072 MiB" in v.cause


def test_sigkill_without_oom_evidence_is_from_outside_never_user_code():
    v = classify_kill(KillEvidence(rank=2, pid=77, signum=signal.SIGKILL))
    assert v is not None and v.rule == "outside-sigkill"
    assert "killed from outside the job" in v.cause
    assert v.fault_class is FaultClass.UNKNOWN and v.component is not Component.USER_CODE
    # the accounting reads the same words back from the failure's evidence
    cls = component_class("crash", f"killed by SIGKILL: {v.cause}")
    assert cls is v.component is Component.EXTERNAL
    assert incident_class(cls)[1] is not Component.USER_CODE


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS])
def test_native_crash_names_the_signal_and_the_log_tail(sig):
    tail = ("step 41 loss 2.31", "Fatal Python error: Segmentation fault", "  File train.py, line 9")
    v = classify_kill(KillEvidence(rank=3, pid=5, signum=sig, log_tail=tail))
    assert v is not None and v.rule == "native-crash"
    assert sig.name in v.cause and "Fatal Python error" in v.cause
    assert component_class("crash", v.cause) is v.component is Component.NATIVE_CODE


def test_an_oom_kill_outranks_the_signal_name():
    v = classify_kill(KillEvidence(rank=0, pid=5, signum=signal.SIGTERM, cgroup_oom_kills=2))
    assert v is not None and v.component is Component.HOST_MEMORY


def test_a_bad_site_rule_file_is_one_clear_error(tmp_path):
    bad = tmp_path / "kills.yaml"
    bad.write_text("rules:\n  - name: x\n    signals: []\n")
    with pytest.raises(ConfigError, match="kills.yaml"):
        load_kill_rules(bad)


def _cgroup_tree(tmp_path: Path, events: str, *, v2: bool = True) -> tuple[Path, Path]:
    proc, root = tmp_path / "proc", tmp_path / "cg"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "statm").write_text("1000 2048 10 1 0 100 0\n")
    if v2:
        (proc / "4242" / "cgroup").write_text("0::/job.slice/run1\n")
        d = root / "job.slice" / "run1"
        target = d / "memory.events"
    else:
        (proc / "4242" / "cgroup").write_text("4:memory:/job/run1\n1:cpu:/\n")
        d = root / "memory" / "job" / "run1"
        target = d / "memory.oom_control"
    d.mkdir(parents=True)
    target.write_text((KILLS / events).read_text())
    return proc, root


def test_memory_events_of_the_workers_cgroup_found_and_read(tmp_path):
    proc, root = _cgroup_tree(tmp_path, "memory.events.oom")
    f = memory_counter_file(4242, proc, root)
    assert f is not None and f.name == "memory.events" and read_oom_kills(f) == 1
    proc1, root1 = _cgroup_tree(tmp_path / "v1", "memory.events.none", v2=False)
    f1 = memory_counter_file(4242, proc1, root1)
    assert f1 is not None and f1.name == "memory.oom_control" and read_oom_kills(f1) == 0


def test_witness_without_a_kernel_log_uses_the_cgroup_count_rise(tmp_path):
    proc, root = _cgroup_tree(tmp_path, "memory.events.none")
    w = KillWitness([4242], kernel_log=lambda: None, proc=proc, cgroup_root=root)
    w.sample({1: 4242}, [1], now=T0)
    (root / "job.slice" / "run1" / "memory.events").write_text((KILLS / "memory.events.oom").read_text())
    kills = w.verdicts({1: -signal.SIGKILL}, {1: 4242}, {})
    assert kills[1].component is Component.HOST_MEMORY
    assert "8 MiB" in kills[1].cause  # 2048 resident pages sampled while it ran


def test_a_kill_the_chaos_plan_sent_is_labelled_injected_with_its_plan_entry(tmp_path):
    from stalwart.chaos.once import injected_by, mark_injected

    mark_injected(tmp_path, "crash at rank 1, step 20", pid=4242)
    assert injected_by(tmp_path, 4242) == "crash at rank 1, step 20" and injected_by(tmp_path, 4243) == ""
    w = KillWitness(
        [], kernel_log=lambda: [], proc=tmp_path, injected_by=lambda pid: injected_by(tmp_path, pid)
    )
    kills = w.verdicts({1: -signal.SIGKILL, 2: -signal.SIGKILL}, {1: 4242, 2: 4243}, {})
    assert kills[1].rule == "chaos-injected" and kills[1].confidence == 1.0
    assert "killed by the chaos plan (crash at rank 1, step 20, SIGKILL)" in kills[1].cause
    assert "outside" not in kills[1].cause and "ask who" not in kills[1].action
    assert component_class("crash", kills[1].what) is kills[1].component is Component.INJECTED
    assert kills[2].rule == "outside-sigkill"  # another pid of the same run: a real kill stays real


def test_an_injected_kill_is_never_mistaken_for_the_oom_killer_nor_the_reverse():
    oom = ("Memory cgroup out of memory: Killed process 7 (python)",)
    v = classify_kill(KillEvidence(rank=0, pid=7, signum=signal.SIGKILL, oom_lines=oom, injected="crash"))
    assert v is not None and v.rule == "chaos-injected"  # the plan's own word outranks a guess
    assert classify_kill(KillEvidence(rank=0, pid=7, signum=signal.SIGKILL, oom_lines=oom)).rule == (
        "kernel-oom-killer"
    )


def test_witness_with_a_readable_kernel_log_trusts_its_lines(tmp_path):
    # the cgroup count rose (a data-loader child was killed), but no kernel line names this pid
    proc, root = _cgroup_tree(tmp_path, "memory.events.none")
    w = KillWitness([4242], kernel_log=lambda: lines("dmesg_memcg_oom.txt"), proc=proc, cgroup_root=root)
    (root / "job.slice" / "run1" / "memory.events").write_text((KILLS / "memory.events.oom").read_text())
    assert w.verdicts({1: -signal.SIGKILL}, {1: 4242}, {})[1].rule == "outside-sigkill"
    assert w.verdicts({2: -signal.SIGKILL}, {2: 13606}, {})[2].rule == "kernel-oom-killer"
    assert w.verdicts({3: 1}, {3: 99}, {}) == {}  # an exit code, not a signal: nothing to weigh


def _snap(kills) -> Snapshot:
    return Snapshot(
        now=T0 + 10,
        tick=0.05,
        node="n0",
        started=T0,
        ranks=(RankView(0, T0 + 5, step=4, sdk=True), RankView(1, T0 + 5, step=4, sdk=True)),
        codes={0: None, 1: -signal.SIGKILL},
        exit_times={1: T0 + 9},
        kills=kills,
    )


def test_the_crash_monitor_blames_the_evidence_not_user_code():
    outside = classify_kill(KillEvidence(rank=1, pid=77, signum=signal.SIGKILL))
    d = crash(_snap({1: outside}), {1: -signal.SIGKILL})
    assert d.incident is not None
    assert d.incident.component is not Component.USER_CODE and d.incident.fault_class is FaultClass.UNKNOWN
    assert "killed from outside the job" in d.reason
    assert d.outcome.failure is not None and "outside" in d.outcome.failure.evidence
    oom = classify_kill(
        KillEvidence(
            rank=1, pid=13606, signum=9, oom_lines=oom_lines_for(13606, lines("dmesg_memcg_oom.txt"))
        )
    )
    d2 = crash(_snap({1: oom}), {1: -signal.SIGKILL})
    assert d2.incident is not None and d2.incident.component is Component.HOST_MEMORY
    assert "kernel OOM killer" in d2.incident.cause


def test_the_accounting_tells_every_kill_rules_words_to_the_rules_own_component():
    # one vocabulary: the interruption's class in the report is the incident's component
    for rule in load_kill_rules().rules:
        what = rule.what.format(signal="SIGKILL", rss="1.0 GiB", tail="(empty)", injected="crash at rank 1")
        assert component_class("crash", what) is rule.component, rule.name
