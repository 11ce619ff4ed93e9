"""Simulated inventories and sizes parse exactly; no NVML means a CPU plan, said plainly."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.core.devices import GIB, MIB, Device, Inventory, inventory, parse_gpu_spec, parse_size
from gateway.core.errors import ConfigError


def test_sizes_in_every_unit() -> None:
    assert parse_size("32GiB") == 32 * GIB
    assert parse_size("24 GB") == 24 * 10**9
    assert parse_size("512MiB") == 512 * MIB
    assert parse_size("1.5TiB") == int(1.5 * 1024**4)
    with pytest.raises(ConfigError, match="write it like 32GiB"):
        parse_size("lots")


def test_gpu_specs() -> None:
    two = parse_gpu_spec("2x32GiB")
    assert [g.index for g in two] == [0, 1] and all(g.total_bytes == g.free_bytes == 32 * GIB for g in two)
    mixed = parse_gpu_spec("1x12GiB,1x24GiB")
    assert [g.total_bytes for g in mixed] == [12 * GIB, 24 * GIB]
    blackwell = parse_gpu_spec("2x32607MiB@12.0")
    assert all(g.compute_capability == (12, 0) and g.total_bytes == 32607 * MIB for g in blackwell)
    busy = parse_gpu_spec("1x24GiB:free=20GiB")
    assert (busy[0].total_bytes, busy[0].free_bytes) == (24 * GIB, 20 * GIB)


@pytest.mark.parametrize("spec", ["", "2x", "twoxbig", "1x24GiB:free=30GiB", "0x24GiB"])
def test_bad_gpu_specs_are_one_clear_error(spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_gpu_spec(spec)


def test_no_driver_means_a_cpu_inventory_with_a_note() -> None:
    machine = inventory()  # this machine has no NVIDIA driver
    assert machine.gpus == () and machine.source == "none"
    assert machine.notes and machine.notes[0].startswith("no NVIDIA GPU found")
    assert machine.ram_total_bytes > 0


def test_ram_override() -> None:
    machine = inventory("2x24GiB", "256GiB")
    assert machine.ram_available_bytes == 256 * GIB and machine.source == "simulated"


@pytest.mark.parametrize("text", ["4096", "64", " 32 "])
def test_a_size_without_a_unit_is_an_error_naming_the_forms(text: str) -> None:
    """`--ram 64` was 64 bytes and `--gpus 2x32` two 32-byte GPUs (a CPU plan, exit 0)."""
    with pytest.raises(ConfigError, match="has no unit: write it like 32GiB, 24GB, 512MiB, 1.5TiB or 64G"):
        parse_size(text)


def test_gpu_specs_and_ram_without_units_are_refused() -> None:
    with pytest.raises(ConfigError, match="'32' has no unit"):
        parse_gpu_spec("2x32")
    with pytest.raises(ConfigError, match="'20' has no unit"):
        parse_gpu_spec("1x24GiB:free=20")
    with pytest.raises(ConfigError, match="'64' has no unit"):
        inventory("2x24GiB", "64")


def test_a_device_reads_back_from_its_json_local_or_remote() -> None:
    local = parse_gpu_spec("1x24GiB@8.6:free=20GiB")[0]
    assert local.to_json()["compute_capability"] == "8.6" and "node" not in local.to_json()
    assert Device.from_json(local.to_json()) == local
    remote = replace(local, node="node2", endpoint="10.0.0.2:50052", link="TCP to 10.0.0.2:8100")
    assert Device.from_json(remote.to_json()) == remote


def test_the_inventory_is_one_list_of_devices_with_one_json() -> None:
    machine = Inventory(
        parse_gpu_spec("1x24GiB@8.6"), 64 * GIB, 60 * GIB, source="simulated",
        remote=(replace(parse_gpu_spec("1x12GiB")[0], node="node2", endpoint="10.0.0.2:50052"),),
    )  # fmt: skip
    kinds = [(d.kind, d.node) for d in machine.devices]
    assert kinds == [("gpu", ""), ("cpu", ""), ("gpu", "node2")]
    assert machine.host.free_bytes == 60 * GIB
    again = Inventory.from_json(machine.to_json())
    assert again.devices == machine.devices and again.source == "simulated"
