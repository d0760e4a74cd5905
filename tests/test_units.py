import pytest

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.units import Quantity, parse


@pytest.mark.parametrize("text, kind, expected", [
    ("900 GB/s", Quantity.BANDWIDTH, 900e9),
    ("400 Gb/s", Quantity.BANDWIDTH, 50e9),
    ("3.35 TB/s", Quantity.BANDWIDTH, 3.35e12),
    ("989 TFLOPS", Quantity.FLOPS, 989e12),
    ("1.979 PFLOP/s", Quantity.FLOPS, 1.979e15),
    ("80 GiB", Quantity.BYTES, 80 * 2**30),
    ("40 MB", Quantity.BYTES, 40e6),
    ("2 us", Quantity.TIME, 2e-6),
    ("30 min", Quantity.TIME, 1800.0),
    ("3 h", Quantity.TIME, 10800.0),
    ("700 W", Quantity.POWER, 700.0),
    (12.5, Quantity.BYTES, 12.5),
])
def test_parse_converts_to_si(text, kind, expected):
    assert parse(text, kind) == pytest.approx(expected)


@pytest.mark.parametrize("text, kind", [("900 GB", Quantity.BANDWIDTH), ("fast", Quantity.FLOPS),
                                         ("80 GiB/s", Quantity.BYTES), (True, Quantity.TIME)])
def test_parse_rejects_wrong_units_naming_the_field(text, kind):
    with pytest.raises(SpecError, match="devices.x.memory: expected"):
        parse(text, kind, "devices.x.memory")
