"""Every phase law: monotone in its inputs, the measured figure at the measured size, a refusal where
no law covers a size (a small run's time is never a large job's)."""

from __future__ import annotations

import json

import pytest

from stalwart.errors import ConfigError
from stalwart.sim.job import TargetJob
from stalwart.sim.laws import Growth, Law, NoLaw, Point, Source
from stalwart.sim.phases import PUBLISHED, Measured, build_laws, load_inplace

SIZES = (1, 2, 4, 8, 16, 64, 512, 4096, 16_384, 65_536, 100_000, 1_000_000)

# a 4-rank CPU run's recovery phases (the shape of the demo's ledger), warm and cold
RUN = Measured(
    ranks=4,
    paths={
        "warm": {
            "detect": 0.1,
            "tear_down": 0.09,
            "decide": 0.0,
            "re_form": 0.24,
            "load": 0.51,
            "first_step": 0.09,
        },
        "cold": {
            "detect": 0.1,
            "tear_down": 0.2,
            "decide": 0.0,
            "re_form": 0.03,
            "load": 8.0,
            "first_step": 0.15,
        },
    },
    step_s=0.065,
)
# in-place phases at 2-16 ranks, in the lead's benchmark's form
INPLACE = {
    2: {
        "detect_s": 0.1,
        "abort_s": 0.05,
        "rendezvous_s": 0.02,
        "pg_init_s": 0.10,
        "transfer_s": 0.2,
        "first_step_s": 0.1,
    },
    4: {
        "detect_s": 0.1,
        "abort_s": 0.06,
        "rendezvous_s": 0.03,
        "pg_init_s": 0.15,
        "transfer_s": 0.2,
        "first_step_s": 0.1,
    },
    8: {
        "detect_s": 0.1,
        "abort_s": 0.08,
        "rendezvous_s": 0.05,
        "pg_init_s": 0.30,
        "transfer_s": 0.2,
        "first_step_s": 0.1,
    },
    16: {
        "detect_s": 0.1,
        "abort_s": 0.12,
        "rendezvous_s": 0.09,
        "pg_init_s": 0.60,
        "transfer_s": 0.2,
        "first_step_s": 0.1,
    },
}


def _laws(inplace=None):
    return build_laws(Measured(RUN.ranks, RUN.paths, RUN.step_s, inplace or {}))


def _monotone(law: Law) -> list[float]:
    values = [law.at(r).value for r in SIZES]
    assert values == sorted(values), (law.phase, values)
    return values


@pytest.mark.parametrize("inplace", [None, INPLACE], ids=["published only", "in-place measured"])
def test_every_phase_law_is_monotone_in_ranks(inplace):
    for law in _laws(inplace).all().values():
        _monotone(law)


@pytest.mark.parametrize(
    "name,path,value",
    [
        ("tear_down", "warm", 0.09),
        ("fork", "warm", 0.24 + 0.51),
        ("spawn", "cold", 0.03 + 8.0),
    ],
)
def test_phases_that_do_not_grow_are_the_measured_figure_at_every_size(name, path, value):
    law = _laws().all()[name]
    assert law.growth is Growth.CONSTANT
    for r in SIZES:
        fig = law.at(r)
        assert fig.value == pytest.approx(value) and fig.source is Source.MEASURED


def test_first_step_is_the_measured_ratio_to_a_step():
    fig = _laws().first_step_ratio.at(16_384)
    assert fig.value == pytest.approx(0.09 / 0.065) and fig.source is Source.MEASURED


@pytest.mark.parametrize(
    "name,field",
    [("abort", "abort_s"), ("inplace_rendezvous", "rendezvous_s"), ("inplace_pg_init", "pg_init_s")],
)
def test_in_place_laws_equal_the_measured_figures_where_measured_and_the_published_at_scale(name, field):
    law = _laws(INPLACE).all()[name]
    for ranks, row in INPLACE.items():
        fig = law.at(ranks)
        assert fig.value == pytest.approx(row[field]) and fig.source is Source.MEASURED
    pub_ranks, pub_value, _ = PUBLISHED[law.phase]
    assert law.at(pub_ranks).value == pytest.approx(pub_value)
    assert law.at(pub_ranks).source is Source.PUBLISHED
    between = law.at(1024)
    assert between.source is Source.FITTED and INPLACE[16][field] < between.value < pub_value


@pytest.mark.parametrize("name", ["rendezvous", "pg_init"])
def test_cold_growing_phases_follow_the_published_figure(name):
    law = _laws().all()[name]
    ranks, value, cite = PUBLISHED[name]
    assert law.at(ranks).value == pytest.approx(value) and cite in law.at(ranks).note
    assert law.at(2 * ranks).value > value  # runs on beyond it, with the last slope


def test_a_small_figure_alone_is_refused_at_another_size():
    law = Law("pg_init", Growth.RANKS, (Point(4, 0.5, Source.MEASURED, "4-rank run"),))
    assert law.at(4).value == 0.5
    with pytest.raises(NoLaw, match="no law says what it is at 16,384"):
        law.at(16_384)


def test_a_measured_figure_above_the_published_one_is_held_not_lowered():
    law = Law(
        "rendezvous",
        Growth.RANKS,
        (Point(16, 2.0, Source.MEASURED, "loaded CPU"), Point(16_384, 1.0, Source.PUBLISHED, "NVRx")),
    )
    assert law.at(16).value == 2.0
    assert law.at(16_384).value == 2.0 and law.at(100_000).value == 2.0
    _monotone(law)


def test_log_growth_is_linear_in_log2_ranks():
    law = Law(
        "x", Growth.LOG_RANKS, (Point(2, 1.0, Source.MEASURED, "a"), Point(8, 3.0, Source.PUBLISHED, "b"))
    )
    assert law.at(4).value == pytest.approx(2.0)
    assert law.at(32).value == pytest.approx(5.0)


def test_no_measurement_falls_back_to_defaults_and_published_figures():
    laws = build_laws(None)
    assert laws.spawn.at(16_384).source is Source.DEFAULT
    assert laws.abort.at(16_384).source is Source.PUBLISHED


def test_state_moves_grow_with_bytes_and_shrink_with_bandwidth():
    small, big = TargetJob(model="8b"), TargetJob(model="405b")
    for g in (1024, 16_384):
        for f in ("load_storage", "staging", "load_host"):
            assert getattr(small, f)(g).value < getattr(big, f)(g).value, f
    fast = TargetJob(model="70b", storage_gbps=8000.0, network_gbps=100.0)
    slow = TargetJob(model="70b")
    assert fast.load_storage(16_384).value < slow.load_storage(16_384).value
    assert fast.load_network(16_384, "x").value < slow.load_network(16_384, "x").value
    # reading every GPU's state from shared storage takes longer the more GPUs read it
    loads = [slow.load_storage(g).value for g in (1024, 4096, 16_384, 65_536)]
    assert loads == sorted(loads)


def test_named_sizes_state_their_defaults():
    job = TargetJob(model="70b")
    lines = job.describe(16_384)
    assert "70.6B parameters (70b default)" in lines[0] and "our assumption" in lines[1]
    state = job.state_bytes_per_gpu(16_384)
    assert state.source is Source.DERIVED and 4e9 < state.value < 5e9
    assert TargetJob(model="70b", state_gb_per_gpu=2.0).state_bytes_per_gpu(16_384).source is Source.GIVEN


def test_inplace_file_is_read_and_bad_ones_are_one_error(tmp_path):
    good = tmp_path / "p.json"
    good.write_text(
        json.dumps(
            {"ranks": {str(r): {**row, "bytes_moved": 10, "state_bytes": 10} for r, row in INPLACE.items()}}
        )
    )
    table = load_inplace(good)
    assert sorted(table) == [2, 4, 8, 16] and table[8]["pg_init_s"] == 0.30
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"ranks": {"4": {"abort_s": -1}}}))
    with pytest.raises(ConfigError, match="abort_s at 4 ranks"):
        load_inplace(bad)
    with pytest.raises(ConfigError, match="no 'ranks' table"):
        bad.write_text("{}")
        load_inplace(bad)


def test_the_in_place_benchmarks_measurements_shape_the_laws():
    """The lead's in-place benchmark (bench/bench_inplace.py, 2-16 ranks, gloo on a loaded 2-core VM):
    where its figures grow with the ranks the laws pass through them; where load made a larger size
    measure less, the law holds the larger figure and says so; at scale the published figures."""
    from pathlib import Path

    table = load_inplace(Path(__file__).parent.parent / "fixtures" / "inplace-phases.json")
    assert sorted(table) == [2, 4, 8, 16]
    laws = _laws(table)
    for name, field in (
        ("abort", "abort_s"),
        ("inplace_rendezvous", "rendezvous_s"),
        ("inplace_pg_init", "pg_init_s"),
    ):
        law = laws.all()[name]
        _monotone(law)
        top = 0.0
        for ranks in sorted(table):
            top = max(top, table[ranks][field])
            fig = law.at(ranks)
            assert fig.source is Source.MEASURED and fig.value == pytest.approx(top)
            assert ("held at" in fig.note) == (top > table[ranks][field])
        pub_ranks, pub_value, _ = PUBLISHED[law.phase]
        at_scale = law.at(pub_ranks)
        assert at_scale.value == pytest.approx(max(pub_value, top))
        # a published figure below a measured one: the measured one holds, and is named as the source
        assert at_scale.source is (Source.PUBLISHED if pub_value >= top else Source.MEASURED)
    # the abort grew with the ranks in every measurement: the law is those figures
    abort = laws.abort
    assert [abort.at(r).value for r in sorted(table)] == [table[r]["abort_s"] for r in sorted(table)]
