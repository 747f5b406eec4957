"""Fake TensorDock v2 API: locations with per-resource pricing, VM create with cloud_init, delete."""

from __future__ import annotations

import random
import uuid
from typing import Any

from .base import FakeCloud, Request, Response

TD_GPUS: list[tuple[str, str, float]] = [  # v0Name, displayName, $/GPU/h
    ("geforcertx4090-pcie-24gb", "GeForce RTX 4090 PCIe 24GB", 0.35),
    ("geforcertx3090-pcie-24gb", "GeForce RTX 3090 PCIe 24GB", 0.20),
    ("rtxa6000-pcie-48gb", "RTX A6000 PCIe 48GB", 0.45),
    ("a100-sxm4-80gb", "A100 SXM4 80GB", 1.20),
    ("h100-sxm5-80gb", "H100 SXM5 80GB", 2.25),
    ("l40-pcie-48gb", "L40 PCIe 48GB", 0.85),  # L40 (not L40S): dropped
    ("rtx4000ada-pcie-20gb", "RTX 4000 Ada PCIe 20GB", 0.20),  # unknown: dropped
]
CITIES = [
    ("Chubbuck", "Idaho", "United States"),
    ("Manchester", "England", "United Kingdom"),
    ("Orlando", "Florida", "United States"),
    ("Winnipeg", "Manitoba", "Canada"),
]


class FakeTensorDock(FakeCloud):
    provider = "tensordock"
    url_suffix = "/api/v2"

    def unauthorized(self, req: Request) -> Response:
        return Response(401, {"error": "Unauthorized"})

    def generate_offers(self, n: int, rng: random.Random) -> list[dict[str, Any]]:
        locations = []
        for k in range(max(1, min(n, 40) // 5)):
            city, state, country = CITIES[k % len(CITIES)]
            gpus = []
            for v0, display, price in rng.sample(TD_GPUS, 4):
                gpus.append(
                    {
                        "v0Name": v0,
                        "displayName": display,
                        "max_count": rng.choice([1, 2, 4, 8]),
                        "price_per_hr": round(price * rng.uniform(0.9, 1.2), 4),
                        "resources": {"max_vcpus": 64, "max_ram_gb": 256, "max_storage_gb": 2000},
                        "pricing": {
                            "per_vcpu_hr": 0.003,
                            "per_gb_ram_hr": 0.002,
                            "per_gb_storage_hr": 0.00005,
                        },
                    }
                )
            locations.append(
                {
                    "id": f"loc-{uuid.UUID(int=rng.getrandbits(128)).hex[:8]}",
                    "city": city,
                    "stateprovince": state,
                    "country": country,
                    "tier": rng.choice([1, 2, 3]),
                    "gpus": gpus,
                }
            )
        return locations

    def op_of(self, req: Request) -> str:
        p = req.path.removeprefix(self.url_suffix)
        if p.startswith("/locations"):
            return "search"
        if p == "/instances":
            return "create" if req.method == "POST" else "list"
        if p.startswith("/instances/"):
            return "delete" if req.method == "DELETE" else "status"
        return "other"

    def route(self, req: Request, op: str) -> Response:
        p = req.path.removeprefix(self.url_suffix)
        if op == "search":
            return Response(200, {"data": {"locations": self.offers}})
        if op == "create":
            return self._create(req.body or {})
        if op == "list":
            return Response(200, {"data": {"instances": [self._public(i) for i in self.instances.values()]}})
        iid = p.split("/")[2]
        inst = self.instances.get(iid)
        if inst is None:
            return Response(404, {"error": "Instance not found"})
        if op == "status":
            inst["_polls"] += 1
            if inst["status"] == "starting" and inst["_polls"] > self.boot_polls:
                inst["status"] = "running"
            return Response(200, {"data": self._public(inst)})
        if op == "delete":
            del self.instances[iid]
            return Response(200, {"data": {"id": iid, "status": "deleted"}})
        return Response(404, {"error": "Not found"})

    def _create(self, body: dict[str, Any]) -> Response:
        attrs = ((body.get("data") or {}).get("attributes")) or {}
        res = attrs.get("resources") or {}
        gpus = res.get("gpus") or {}
        loc = next((x for x in self.offers if x["id"] == attrs.get("location_id")), None)
        if not attrs.get("name") or loc is None or not gpus:
            return Response(
                400, {"error": "Invalid request: name, location_id and resources.gpus are required"}
            )
        if int(res.get("storage_gb") or 0) < 100:
            return Response(400, {"error": "storage_gb must be at least 100"})
        if not (attrs.get("cloud_init") or {}).get("runcmd"):
            return Response(
                400, {"error": "cloud_init.runcmd is required by this fake (the runner starts there)"}
            )
        ((v0, spec),) = gpus.items()
        gpu = next((g for g in loc["gpus"] if g["v0Name"] == v0), None)
        if gpu is None or gpu["max_count"] < int(spec.get("count") or 1):
            return self.capacity_response(None)  # type: ignore[arg-type]
        iid = str(uuid.uuid4())
        self.instances[iid] = {
            "type": "virtualmachine",
            "id": iid,
            "name": attrs["name"],
            "status": "starting",
            "ipAddress": "203.0.113.7",
            "rateHourly": gpu["price_per_hr"] * int(spec["count"]),
            "_polls": 0,
            "_cloud_init": attrs.get("cloud_init"),
        }
        self.track_created(attrs["name"])
        return Response(
            201, {"data": {"type": "virtualmachine", "id": iid, "name": attrs["name"], "status": "starting"}}
        )

    def capacity_response(self, req: Request) -> Response:
        return Response(400, {"error": "No available GPUs of this type at this location"})

    def _public(self, inst: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in inst.items() if not k.startswith("_")}

    def preempt(self, instance_id: str) -> None:
        """A host problem: the VM stops."""
        with self.lock:
            self.instances[instance_id]["status"] = "stopped"

    def label_of(self, inst: dict[str, Any]) -> str | None:
        return inst.get("name")
