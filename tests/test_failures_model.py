"""Failure specs, lifetimes, checkpoint sizes and times, and the closed-form checkpoint cycle."""

import math

import numpy as np
import pytest
import yaml

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.failures import (
    Distribution, DistributionKind, Domain, FailureCause, Hazard, HazardSpec,
    failure_model_from_mapping,
)
from clustersim.hardware_specs.fields import Fields
from clustersim.simulator.longrun.checkpointing import (
    CheckpointLevel, CheckpointPolicy, CheckpointSetup, checkpoint_cost,
    daly_interval, young_interval,
)
from clustersim.simulator.longrun.checkpoint_state import checkpoint_bytes, checkpoint_state
from clustersim.simulator.longrun.lifetimes import draw, lifetimes
from clustersim.simulator.longrun.cycle import Cycle, Level

from clustersim.analysis.config import load_config
from clustersim.analysis.failures.config import failure_spec
from tests.conftest import REPO


def test_llama3_model_reproduces_the_paper_mtbf_and_rack_domains(catalog):
    model = catalog.failure_models["llama3-405b-h100"]
    # 419 unexpected interruptions in 54 days on 2,048 nodes (Llama 3 sec. 3.3.4).
    assert model.job_mtbf_s(2048) / 3600 == pytest.approx(54 * 24 / 419, rel=0.005)
    assert model.domain_nodes(Domain.RACK) == 2 and model.domain_nodes(Domain.NODE) == 1
    assert FailureCause.GPU.replaces_node and not FailureCause.SOFTWARE.replaces_node
    assert FailureCause.MAINTENANCE.planned


def test_config_overrides_the_catalog_model(catalog):
    base = catalog.failure_models["llama3-405b-h100"]
    f = Fields(yaml.safe_load("""
rates_per_1000_node_days: {gpu: 3.0}
hazards: {hbm: {hazard: weibull, weibull_shape: 0.7}}
correlated: {switch_cable: {domain: switch, probability: 0.5}}
stragglers: {rate_per_1000_node_days: 2, slowdown: {distribution: uniform, low: 1.1, high: 2},
             duration: {distribution: log_uniform, low: 30 s, high: 10 h}}
"""), "failures.model")
    model = failure_model_from_mapping(f, base)
    assert model.rates_per_1000_node_days[FailureCause.GPU] == 3.0
    hbm = FailureCause.HBM
    assert model.rates_per_1000_node_days[hbm] == base.rates_per_1000_node_days[hbm]
    assert model.hazard_of(FailureCause.HBM) == HazardSpec(hazard=Hazard.WEIBULL, weibull_shape=0.7)
    assert model.hazard_of(FailureCause.GPU).hazard is Hazard.EXPONENTIAL
    assert model.correlated[FailureCause.SWITCH_CABLE].probability == 0.5
    assert model.stragglers.duration.high == 36000.0


@pytest.mark.parametrize("text, field", [
    ("rates_per_1000_node_days: {gpus: 1}", "failures.model.rates_per_1000_node_days.gpus"),
    ("correlated: {gpu: {domain: pod, probability: 1}}", "failures.model.correlated.gpu.domain"),
    ("correlated: {gpu: {domain: rack, probability: 2}}",
     "failures.model.correlated.gpu.probability"),
    ("stragglers: {rate_per_1000_node_days: 1, duration: {distribution: fixed, value: 1 h},"
     " slowdown: {distribution: uniform, low: 0.5, high: 2}}",
     "failures.model.stragglers.slowdown.low"),
])
def test_bad_model_overrides_name_the_field(catalog, text, field):
    base = catalog.failure_models["bloom-176b-a100"]
    with pytest.raises(SpecError) as err:
        failure_model_from_mapping(Fields(yaml.safe_load(text), "failures.model"), base)
    assert err.value.field == field


@pytest.mark.parametrize("interval, message", [
    ("soon", "failures.checkpoint.interval: expected young, daly, a time"),
    ("-3 h", "failures.checkpoint.interval"),
])
def test_bad_interval_names_the_field(interval, message):
    config = load_config(REPO / "examples" / "failures_bloom_176b.yaml")
    section = dict(config.sections["failures"], checkpoint={"interval": interval})
    with pytest.raises(SpecError, match=message):
        failure_spec(config, section=section)


def test_interval_in_steps_and_recovery_checks():
    config = load_config(REPO / "examples" / "failures_bloom_176b.yaml")
    spec = failure_spec(config)
    assert spec.interval_steps == 100 and spec.step_time_s == 105.0
    with pytest.raises(SpecError, match="failures.recovery.min_replicas: 9 exceeds strategy.dp=8"):
        failure_spec(config, section={"recovery": {"policy": "elastic", "min_replicas": 9}})
    with pytest.raises(SpecError, match="failures.recovery.detection"):
        failure_spec(config, section={"recovery": {"detection": "fast"}})


@pytest.mark.parametrize("hazard", [HazardSpec(),
                                    HazardSpec(hazard=Hazard.WEIBULL, weibull_shape=0.6),
                                    HazardSpec(hazard=Hazard.WEIBULL, weibull_shape=2.0)])
def test_lifetimes_keep_the_rate_whatever_the_hazard(hazard):
    """A Weibull shape moves failures in a part's life, not their long-run rate."""
    rng = np.random.default_rng(1)
    samples = lifetimes(rng, 1.0 / 1000.0, hazard, 200_000)
    assert samples.mean() == pytest.approx(1000.0, rel=0.02)


def test_distributions_draw_within_their_range():
    rng = np.random.default_rng(2)
    d = Distribution(kind=DistributionKind.LOG_UNIFORM, low=30.0, high=36000.0)
    values = np.array([draw(rng, d) for _ in range(20000)])
    assert values.min() >= 30.0 and values.max() <= 36000.0
    assert values.mean() == pytest.approx(d.expected(), rel=0.05)
    lognormal = Distribution(kind=DistributionKind.LOGNORMAL, median=1.5, sigma=0.2)
    assert np.median([draw(rng, lognormal) for _ in range(20000)]) == pytest.approx(1.5, rel=0.02)


def test_bloom_checkpoint_is_the_chronicles_2_3_tb():
    """bigscience tr11 README: 176e9 params x 14 bytes = 2294.77 GiB ("2.3TB")."""
    config = load_config(REPO / "examples" / "failures_bloom_176b.yaml")
    size = checkpoint_bytes(config.job)
    assert size / 2**30 == pytest.approx(2294.77 * config.job.model.parameters / 176e9, rel=1e-3)


def test_checkpoint_times_follow_bandwidth_and_writers():
    """Llama 3 405B: 405.85e9 x 14 B = 5.68 TB over Tectonic's 2 TB/s (sec. 3.3.1)."""
    config = load_config(REPO / "examples" / "failures_llama3_405b.yaml")
    job, cluster = config.job, config.cluster
    storage = cluster.checkpoint_storage
    held = checkpoint_state(job)
    costs = {p: checkpoint_cost(CheckpointSetup(policy=p, storage=storage), held, cluster)
             for p in CheckpointPolicy}
    state = job.model.parameters * 14.0
    assert costs[CheckpointPolicy.SHARDED].blocking_s == pytest.approx(state / 2e12)
    # One replica's 16 nodes reach 16 x 400 GB/s > 2 TB/s: also storage-bound.
    assert costs[CheckpointPolicy.SYNC].blocking_s == pytest.approx(state / 2e12)
    slow_nodes = checkpoint_cost(CheckpointSetup(policy=CheckpointPolicy.SYNC, storage=storage,
                                                 node_storage_bandwidth=25e9), held, cluster)
    assert slow_nodes.blocking_s == pytest.approx(state / (16 * 25e9))
    async_ = costs[CheckpointPolicy.ASYNC]
    assert async_.blocking_s < 0.5 and async_.levels[0].background_s == pytest.approx(state / 2e12)
    memory = costs[CheckpointPolicy.IN_MEMORY]
    assert [lv.durable for lv in memory.levels] == [False, True]
    assert memory.levels[0].load_s < memory.levels[1].load_s
    measured = checkpoint_cost(CheckpointSetup(policy=CheckpointPolicy.SYNC, storage=storage,
                                               save_time_s=40.0), held, cluster)
    assert measured.blocking_s == 40.0


def test_checkpoint_cost_needs_only_byte_counts(catalog):
    """No job: 1 TB written by a 2-node replica (16 GPUs, 8 per node) to a tier of the
    cluster; doubling the state doubles a storage-bound pause."""
    from clustersim.simulator.longrun.checkpointing import CheckpointState
    cluster = catalog.cluster(device="h100-sxm", num_devices=64)
    setup = CheckpointSetup(policy=CheckpointPolicy.SYNC, storage=cluster.checkpoint_storage,
                            node_storage_bandwidth=10e9)
    one = CheckpointState(total_bytes=1e12, device_bytes=1e12 / 16, replica_devices=16)
    two = CheckpointState(total_bytes=2e12, device_bytes=2e12 / 16, replica_devices=16)
    pause = checkpoint_cost(setup, one, cluster).blocking_s
    assert pause == pytest.approx(1e12 / (2 * 10e9))
    assert checkpoint_cost(setup, two, cluster).blocking_s == pytest.approx(2 * pause)


@pytest.mark.parametrize("mtbf_min, optimum_min", [(24 * 60, 117), (6 * 60, 57), (15, 9.1)])
def test_daly_higher_order_interval_matches_the_paper(mtbf_min, optimum_min):
    """Daly 2006 (FGCS 22(3)) Figs. 3-5: delta = 5 min, R = 10 min, M = 24 h, 6 h, 15 min."""
    assert daly_interval(5.0, mtbf_min) == pytest.approx(optimum_min, abs=0.5)
    assert young_interval(5.0, 24 * 60) == pytest.approx(120.0)


@pytest.mark.parametrize("origin, interval, pause", [(0.0, 10.0, 2.0), (5.0, 3.0, 0.5),
                                                     (1.0, 100.0, 0.001)])
def test_cycle_closed_form_matches_stepping_through_it(origin, interval, pause):
    c = Cycle(origin, interval, pause)
    dt = 0.0005
    t, trained = origin, 0.0
    for probe in np.linspace(origin, origin + 7.3 * (interval + pause), 13):
        while t < probe - 1e-12:
            if (t - origin) % (interval + pause) < interval:
                trained += dt
            t += dt
        assert c.train_time(probe) == pytest.approx(trained, abs=3 * dt)
        if trained > 0:
            assert c.train_time(c.time_at_train(trained)) == pytest.approx(trained, abs=1e-9)
    assert c.last_taken(origin + interval + pause) == 0
    assert c.last_taken(origin + interval + pause - 1e-6) == -1


def test_level_keeps_the_newest_usable_copy():
    """A copy whose background write is still running is not a restore point yet."""
    c = Cycle(0.0, 10.0, 1.0)
    level = Level(CheckpointLevel(every=1, background_s=5.0, load_s=1.0, durable=True))
    level.new_cycle((100.0, -math.inf))
    level.advance(c, 0.0, 100.0, 1.0, 24.0)   # checkpoints 0 (taken 11) and 1 (taken 22)
    assert level.restore(24.0) == (110.0, 16.0)    # 1 is still being written until 27
    assert level.restore(27.0) == (120.0, 27.0)
    assert level.restore(5.0)[0] == 100.0
    assert math.isinf(-Level(level.spec).restore(0.0)[1])


def test_confidence_intervals_stay_within_what_the_quantity_can_be():
    """Two runs with 0 and 7 interruptions: the normal approximation alone would put the lower
    end below zero; an ETTR interval never passes 100%."""
    from clustersim.analysis.failures.study import Stat
    count = Stat.of([0, 7])
    assert count.ci95[0] == 0.0 and count.ci95[1] > 7
    ettr = Stat.of([0.2, 0.99], upper=1.0)
    assert ettr.ci95[1] == 1.0 and ettr.ci95[0] >= 0.0
