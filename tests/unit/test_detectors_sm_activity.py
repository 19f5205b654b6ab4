"""SM activity (GPM) as a straggler signal on jobs that push no comm wait: against the node's GPUs at the same
instant, trimmed, judged only without a compute share, never on a whole node or a shift."""

from dataclasses import replace

from gpumond.rules.detectors.config import DetectorConfig
from gpumond.rules.detectors.engine import DetectorState, evaluate
from gpumond.rules.detectors.sm_activity import node_relative
from gpumond.rules.types import GpuSample
from tests.unit.detector_inputs import build


def _window(uuid, node, values):
    return tuple(GpuSample(uuid, node, "0", float(t), True, {"sm_active": v} if v is not None else {})
                 for t, v in enumerate(values))


def _node(readings, node="n0"):
    """uuid → its window, for one node whose GPUs read `readings[i]` (a list over instants)."""
    return {f"GPU-{node}-{i}": _window(f"GPU-{node}-{i}", node, xs) for i, xs in enumerate(readings)}


def _relative(windows, min_gpus=4, min_instants=6, trim=0.25):
    return node_relative(windows, {u: w[0].node for u, w in windows.items()}, 0.0, min_gpus, min_instants, trim)


def test_each_reading_counts_against_its_nodes_median_at_the_same_instant():
    # The step's phase moves the whole node (0.2 at some instants, 0.8 at others): it cancels.
    phase = [0.2, 0.8] * 6
    slow = [v + 0.1 for v in phase]
    out = _relative(_node([phase] * 7 + [slow]))
    assert round(out["GPU-n0-7"], 9) == 0.1 and all(abs(v) < 1e-12 for u, v in out.items() if u != "GPU-n0-7")


def test_a_transient_in_a_few_readings_is_trimmed_off_and_a_lasting_deviation_is_not():
    base = [0.8] * 12
    transient = [0.8] * 10 + [0.95, 0.95]
    lasting = [0.9] * 12
    out = _relative(_node([base] * 6 + [transient, lasting]))
    assert abs(out["GPU-n0-6"]) < 1e-12 and round(out["GPU-n0-7"], 9) == 0.1


def test_too_few_gpus_at_an_instant_or_too_few_instants_or_mig_slices_give_nothing():
    assert _relative(_node([[0.8] * 12] * 3)) == {}  # three GPUs: no node median worth the name
    sparse = _node([[0.8] * 12] * 7 + [[0.9] * 5 + [None] * 7])
    assert "GPU-n0-7" not in _relative(sparse) and len(_relative(sparse)) == 7
    mig = {f"MIG-{i}": _window(f"MIG-{i}", "n0", [0.8] * 12) for i in range(8)}
    assert _relative(mig) == {}


def _with_sm(gpu_sm, **kw):
    return build(gpu={r: {"sm_active": v} for r, v in gpu_sm.items()}, **kw)


def _stragglers(inputs):
    _, found = evaluate(inputs, DetectorState(), DetectorConfig())
    return [(c.kind, c.rank, c.evidence["signals"]) for c in found if c.kind.startswith("straggler")]


def test_a_rank_computing_while_its_node_spins_is_a_straggler_on_sm_activity_alone():
    sm = {r: 0.6 + 0.002 * (r % 5) for r in range(32)}
    assert _stragglers(_with_sm(sm)) == []
    sm[13] = 0.75
    ((kind, rank, signals),) = _stragglers(_with_sm(sm))
    assert (kind, rank, set(signals)) == ("straggler", 13, {"sm_active"})
    assert signals["sm_active"]["value"] == 0.145  # its reading over its node's median (0.605)


def test_gpus_without_gpm_are_judged_as_before_and_their_node_needs_four_readers():
    sm = {r: 0.6 for r in range(32)}
    sm[13] = 0.75
    inputs = _with_sm(sm)
    # A V100-like node-1 where only three GPUs (13 among them) export sm_active: no node median, no signal.
    no_gpm = {f"GPU-{r:04d}" for r in range(8, 16)} - {"GPU-0008", "GPU-0009", "GPU-0013"}
    windows = {u: tuple(replace(s, values={k: v for k, v in s.values.items() if k != "sm_active"}) for s in w)
               if u in no_gpm else w for u, w in inputs.gpu_windows.items()}
    assert _stragglers(replace(inputs, gpu_windows=windows)) == []
    assert [r for _, r, _ in _stragglers(inputs)] == [13]


def test_a_whole_node_reading_high_is_workload_structure_not_a_straggler():
    sm = {r: 0.6 for r in range(32)}
    sm.update({r: 0.8 for r in range(8, 16)})  # a heavier stage's node: its median moves with it
    assert _stragglers(_with_sm(sm)) == []


def test_many_ranks_standing_out_together_are_a_shift():
    sm = {r: 0.6 for r in range(32)}
    sm.update({r: 0.75 for r in (1, 2, 9, 10, 17, 18, 25, 26)})  # two a node, everywhere
    assert _stragglers(_with_sm(sm)) == []


def test_a_job_that_pushes_comm_waits_is_judged_on_its_compute_share_not_sm_activity():
    sm = {r: 0.6 for r in range(32)}
    sm[13] = 0.75
    inputs = _with_sm(sm)
    timed = lambda w: replace(w, steps=tuple(replace(s, comm_wait_s=0.1 * s.duration_s) for s in w.steps))  # noqa: E731
    jobs = {job: {r: timed(w) for r, w in ranks.items()} for job, ranks in inputs.jobs.items()}
    assert _stragglers(replace(inputs, jobs=jobs)) == []
    # Also in a job where one rank's SDK times no collective: the others still have their compute share.
    jobs = {job: {r: timed(w) if r else w for r, w in ranks.items()} for job, ranks in inputs.jobs.items()}
    assert _stragglers(replace(inputs, jobs=jobs)) == []


def _reference(windows, node_of, since, min_gpus, min_instants, trim):
    """The definition, one instant and one GPU at a time."""
    from gpumond.rules.detectors.features import trimmed_mean
    from gpumond.rules.detectors.stats import median
    at = {}
    for uuid, node in node_of.items():
        for s in windows.get(uuid, ()):
            if not uuid.startswith("MIG-") and s.up and s.t >= since and "sm_active" in s.values:
                at.setdefault((node, s.t), {})[uuid] = s.values["sm_active"]
    dev = {}
    for readings in at.values():
        if len(readings) >= min_gpus:
            med = median(list(readings.values()))
            for uuid, v in readings.items():
                dev.setdefault(uuid, []).append(v - med)
    return {u: trimmed_mean(xs, trim) for u, xs in dev.items() if len(xs) >= min_instants}


def test_the_vectorised_job_equals_the_definition_on_ragged_windows():
    import random
    rnd = random.Random(7)
    windows, node_of = {}, {}
    for i in range(40):
        uuid, node = (f"MIG-{i}" if i == 3 else f"GPU-{i}"), f"n{i // 8}"
        node_of[uuid] = node
        windows[uuid] = tuple(GpuSample(uuid, node, "0", float(t) + (0.5 if i == 17 else 0.0), rnd.random() > 0.05,
                                        {"sm_active": rnd.random()} if rnd.random() > 0.15 else {})
                              for t in range(-3, 12))
    for trim in (0.0, 0.1, 0.25):
        got, want = node_relative(windows, node_of, 0.0, 4, 6, trim), _reference(windows, node_of, 0.0, 4, 6, trim)
        assert got.keys() == want.keys() and len(got) > 20
        assert all(abs(got[u] - want[u]) < 1e-12 for u in got)
