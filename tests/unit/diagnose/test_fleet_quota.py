"""The quota classes `dradriver fleet --quota-classes` and `--kueue` write: the
DeviceClass names the chart makes of quotaClasses values, and Kueue's mapping of each."""

from __future__ import annotations

from dradriver.diagnose.fleet_quota import kueue_mappings, quota_class_names


def test_kueue_charges_each_quota_class_as_a_resource_of_its_name() -> None:
    values = {
        "products": [{"name": "h100-80gb-hbm3", "productName": "NVIDIA H100 80GB HBM3"}],
        "migProfiles": [
            {"profile": "1g.10gb+me"},
            {"name": "3g40gb-h100", "profile": "3g.40gb", "productName": "x"},
        ],
    }
    names = quota_class_names(values)
    assert names == [
        "h100-80gb-hbm3.gpu.dradriver.io",
        "1g10gb-me.mig.dradriver.io",
        "3g40gb-h100.mig.dradriver.io",
    ]
    (first, *_) = kueue_mappings(names)["resources"]["deviceClassMappings"]
    assert first == {
        "name": "h100-80gb-hbm3.gpu.dradriver.io",
        "deviceClassNames": ["h100-80gb-hbm3.gpu.dradriver.io"],
    }
