"""Nodes as the last discovery saw them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from healthd.model import Node
from healthd.store.db import Database

NODE_SEEN_REFRESH_S = 600.0
"""A node unchanged since its last write has its ``last_seen`` rewritten only this often."""


class NodesStore(Database):
    def upsert_nodes(self, nodes: Iterable[Node], seen_at: float) -> None:
        """Record what discovery saw. Only nodes that changed since this object last wrote them (or whose
        ``last_seen`` is ``NODE_SEEN_REFRESH_S`` old) are written: a discovery of a steady fleet is cheap."""
        changed = [n for n in nodes if (n.name not in self._nodes_written
                                        or self._nodes_written[n.name][0] != n
                                        or seen_at - self._nodes_written[n.name][1] >= NODE_SEEN_REFRESH_S)]
        if not changed:
            return
        with self._tx() as db:
            db.executemany(
                "INSERT INTO nodes (name, state, flags, partitions, gpus, gpu_type, features, reason, node_class,"
                " last_seen) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET state = excluded.state, flags = excluded.flags,"
                " partitions = excluded.partitions, gpus = excluded.gpus, gpu_type = excluded.gpu_type,"
                " features = excluded.features, reason = excluded.reason, node_class = excluded.node_class,"
                " last_seen = excluded.last_seen",
                [
                    (n.name, n.state, json.dumps(sorted(n.flags)), json.dumps(list(n.partitions)), n.gpus,
                     n.gpu_type, json.dumps(list(n.features)), n.reason, n.node_class, seen_at)
                    for n in changed
                ],
            )
        self._nodes_written.update((n.name, (n, seen_at)) for n in changed)

    def nodes(self, *, seen_since: float = 0.0, names: Sequence[str] | None = None) -> list[Node]:
        """The nodes seen since ``seen_since`` (of ``names`` only, when given), by name."""
        if names is None:
            rows = self._query("SELECT * FROM nodes WHERE last_seen >= ? ORDER BY name", (seen_since,))
        else:
            rows = []
            for i in range(0, len(names), 500):
                part = list(names[i:i + 500])
                marks = ",".join("?" * len(part))
                rows += self._query(f"SELECT * FROM nodes WHERE last_seen >= ? AND name IN ({marks}) ORDER BY name",
                                    (seen_since, *part))
        return [
            Node(
                name=r["name"],
                state=r["state"],
                flags=frozenset(json.loads(r["flags"])),
                partitions=tuple(json.loads(r["partitions"])),
                gpus=r["gpus"],
                gpu_type=r["gpu_type"],
                features=tuple(json.loads(r["features"])),
                reason=r["reason"],
                node_class=r["node_class"],
            )
            for r in rows
        ]

