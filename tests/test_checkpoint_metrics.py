"""What a scrape says of checkpoints and cold segments: counters that move with them."""

from __future__ import annotations

import pathlib

import pytest
import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import gateway.container.maintenance as maintenance
from gateway.metrics import GatewayCollector
from gateway.node import Node, open_node
from gateway.storage.layer import ChunkLayer
from gateway.storage.memory_storage import MemoryStorage
from tests.helpers.container import DirectContainer
from tests.helpers.segments import make_config

pytestmark = pytest.mark.timeout(60)

SEGMENTS = 8


def scrape(node: Node) -> dict[str, float]:
    """The node's metrics as a scrape shows them, by name and labels."""
    registry = CollectorRegistry()
    registry.register(GatewayCollector(node))
    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


async def test_a_scrape_counts_checkpoints_by_kind_and_shows_cold_segments(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(maintenance, "COOL_INTERVAL", 0.05)
    config = make_config(
        tmp_path,
        container={"checkpoint_min_segments": 2},
        tier2={"flush_interval": "30s", "snapshot_interval": "0s", "gc_interval": "1h"},
    )
    layer = ChunkLayer(MemoryStorage(), max_concurrency=4)
    async with open_node(config, layer, container_type=DirectContainer) as node:
        c = node.container
        assert isinstance(c, DirectContainer)
        p = "segment_gateway_"
        first = scrape(node)
        assert first[f"{p}cold_segments"] == 0
        for i in range(SEGMENTS):
            await c.create(f"s{i}")
            await c.append(f"s{i}", b"x" * 100)
            await c.seal(f"s{i}")
        await c.flush()
        await c.checkpoint()  # the first of this run: whole
        whole = scrape(node)
        assert whole[f'{p}checkpoints_total{{kind="whole"}}'] == 1 + first.get(
            f'{p}checkpoints_total{{kind="whole"}}', 0
        )
        records = whole[f"{p}checkpoint_records_total"] - first[f"{p}checkpoint_records_total"]
        assert records == SEGMENTS
        assert whole[f"{p}checkpoint_bytes_total"] > first[f"{p}checkpoint_bytes_total"] + 100
        await c.checkpoint()  # rolling now: a share of two unchanged segments
        rolling = scrape(node)
        assert (
            rolling[f'{p}checkpoints_total{{kind="rolling"}}']
            == 1 + whole[f'{p}checkpoints_total{{kind="rolling"}}']
        )
        assert rolling[f"{p}checkpoint_records_total"] == whole[f"{p}checkpoint_records_total"] + 2
        # Sealed, in Tier 2, idle: the cooling task makes them cold.
        with trio.fail_after(20):
            while scrape(node)[f"{p}cold_segments"] < SEGMENTS:  # noqa: ASYNC110
                await trio.sleep(0.05)
        await c.delete("s0")  # and the gauge follows at the next pass
        with trio.fail_after(20):
            while scrape(node)[f"{p}cold_segments"] != SEGMENTS - 1:  # noqa: ASYNC110
                await trio.sleep(0.05)
