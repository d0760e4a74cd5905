"""Renting at a provider's published on-demand price (``costs: {gpu_hour: on_demand}``): whole
instances at the dated price the catalog's ``prices`` section holds for the cluster's node."""

from __future__ import annotations

import pytest
import yaml

from clustersim.analysis.config import config_from_mapping
from clustersim.analysis.sweeps.costs import (
    cost_per_hour, cost_per_million_tokens, costs_for, costs_from_mapping,
)
from clustersim.hardware_specs import SpecError, load_catalog
from tests.test_sweep import TINY, clustersim, write_config

P5 = {**TINY, "strategy": {"tp": 2, "pp": 2, "dp": 1},
      "cluster": {"node": "aws-p5-48xlarge", "num_gpus": 4}}


def test_every_published_price_is_dated_and_names_a_catalog_node():
    catalog = load_catalog()
    assert {"aws-p5-48xlarge", "aws-p6-b200-48xlarge", "azure-nd-h100-v5",
            "azure-nd-h200-v5"} <= set(catalog.prices)
    # Azure Retail Prices API (eastus2, 2026-06-18): 98.32 and 84.80 USD per 8-GPU VM-hour
    assert catalog.prices["azure-nd-h200-v5"].per_gpu_hour(8) == pytest.approx(10.60)
    for name, price in catalog.prices.items():
        assert name in catalog.nodes and price.instance_hour > 0 and price.source
        assert price.as_of[:4].isdigit() and price.region


def test_on_demand_rents_whole_instances_at_the_published_price():
    """4 GPUs of an 8-GPU p5.48xlarge rent the whole instance: 55.04 USD per hour (AWS Pricing
    API, us-east-1, 2026-01-19); a million tokens at 1e5 tokens/s take 10 s."""
    config = config_from_mapping(P5)
    assert config.cluster.device.name == "h100-sxm"     # the instance's own GPU by default
    spec = costs_for({"gpu_hour": "on_demand"}, config.cluster, config.catalog)
    assert cost_per_hour(spec, config.cluster) == pytest.approx(55.04)
    assert cost_per_million_tokens(spec, config.cluster, 1e5) == pytest.approx(55.04 / 360)
    assert spec.currency == "USD" and spec.rented[0][1].as_of == "2026-01-19"


def test_a_node_without_a_published_price_is_an_error_naming_the_priced_ones():
    config = config_from_mapping(TINY)                   # a DGX H100: bought, not rented
    with pytest.raises(SpecError) as err:
        costs_for({"gpu_hour": "on_demand"}, config.cluster, config.catalog)
    assert str(err.value).startswith("costs.gpu_hour: on_demand: no published price for node "
                                     "'dgx-h100' (priced: aws-p4d-24xlarge")


@pytest.mark.parametrize("section, message", [
    ({"gpu_hour": "cheap"}, "costs.gpu_hour: expected a price per GPU-hour or on_demand, got "
                            "'cheap'"),
    ({"gpu_hour": "on_demand", "capex_per_gpu": 1, "amortization_years": 4},
     "costs.capex_per_gpu: give gpu_hour (rent) or capex_per_gpu (buy), not both"),
])
def test_bad_rental_prices_name_the_field(section, message):
    with pytest.raises(SpecError) as err:
        costs_from_mapping(section)
    assert str(err.value) == message


def test_a_price_for_an_unknown_node_or_without_a_date_is_refused(tmp_path):
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"prices": {"aws-p5-48xlage": {
        "instance_hour": 1.0, "region": "r", "as_of": "2026-01-19", "source": "s"}}}))
    with pytest.raises(SpecError, match=r"p.yaml: prices.aws-p5-48xlage: prices no known node; "
                                        r"did you mean aws-p5-48xlarge"):
        load_catalog([tmp_path])
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"prices": {"aws-p5-48xlarge": {
        "instance_hour": 1.0, "region": "r", "as_of": "January 2026", "source": "s"}}}))
    with pytest.raises(SpecError, match="as_of: expected an ISO date"):
        load_catalog([tmp_path])


def test_simulate_prints_the_cost_with_its_price_and_date(tmp_path):
    path = write_config(tmp_path, strategy=P5["strategy"], cluster=P5["cluster"],
                        costs={"gpu_hour": "on_demand"})
    done = clustersim("simulate", str(path))
    assert done.returncode == 0, done.stderr
    assert "USD per million tokens (55.04 USD per hour)" in done.stdout
    assert ("1 x aws-p5-48xlarge at 55.04 USD/h on demand (us-east-1, as of 2026-01-19"
            in done.stdout)
    bad = write_config(tmp_path, costs={"gpu_hour": "on_demand"})
    done = clustersim("simulate", str(bad))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "costs.gpu_hour: on_demand: no published price for node 'dgx-h100'" in done.stderr
