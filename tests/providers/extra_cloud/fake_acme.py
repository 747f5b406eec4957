"""The fake Acme GPU Cloud server (see acme.py): the one other file a new cloud brings."""

from __future__ import annotations

import random
from typing import Any

from fakes.clouds.base import FakeCloud, Request, Response

MACHINES = [
    {"id": "m-4090x1", "gpu": "RTX 4090", "gpus": 1, "usd_per_hour": 0.14, "region": "eu-west"},
    {"id": "m-4090x2", "gpu": "RTX 4090", "gpus": 2, "usd_per_hour": 0.28, "region": "eu-west"},
    {"id": "m-h100x1", "gpu": "H100 SXM", "gpus": 1, "usd_per_hour": 1.45, "region": "eu-north"},
    {"id": "m-h100x8", "gpu": "H100 SXM", "gpus": 8, "usd_per_hour": 11.6, "region": "eu-north"},
]


class FakeAcme(FakeCloud):
    provider = "acme"

    def generate_offers(self, n: int, rng: random.Random) -> list[dict[str, Any]]:
        return [dict(m) for m in MACHINES]

    def op_of(self, req: Request) -> str:
        if req.path == "/v1/machines":
            return "search"
        if req.path == "/v1/instances":
            return "create" if req.method == "POST" else "list"
        if req.path.startswith("/v1/instances/"):
            return "delete" if req.method == "DELETE" else "status"
        return "other"

    def route(self, req: Request, op: str) -> Response:
        if op == "search":
            return Response(200, {"machines": self.offers})
        if op == "list":
            for inst in self.instances.values():
                self._advance(inst)
            return Response(200, {"instances": list(self.instances.values())})
        if op == "create":
            body = req.body or {}
            machine = next((m for m in self.offers if m["id"] == body.get("machine")), None)
            if machine is None:
                return Response(400, {"error": "no_such_machine"})
            iid = self.new_id()
            self.instances[iid] = {
                "id": iid,
                "name": body.get("name"),
                "state": "starting",
                "usd_per_hour": machine["usd_per_hour"],
                "image": body.get("image"),
            }
            self.track_created(body.get("name"))
            return Response(201, self.instances[iid])
        iid = req.path.rsplit("/", 1)[-1]
        inst = self.instances.get(iid)
        if inst is None:
            return Response(404, {"error": "not_found"})
        if op == "delete":
            inst["state"] = "deleted"
            return Response(200, inst)
        self._advance(inst)
        return Response(200, inst)

    def _advance(self, inst: dict[str, Any]) -> None:
        if inst["state"] == "starting":
            inst["state"] = "running"

    def capacity_response(self, req: Request) -> Response:
        return Response(200, {"error": "sold_out"})

    def is_live(self, inst: dict[str, Any]) -> bool:
        return inst["state"] != "deleted"

    def label_of(self, inst: dict[str, Any]) -> str | None:
        return inst.get("name")
