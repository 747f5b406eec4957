"""Fake Lambda Cloud API: cents per hour, descriptions to parse, empty regions, error codes."""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

from .base import FakeCloud, Request, Response

LAMBDA_TYPES: list[tuple[str, str, int, list[tuple[str, str]]]] = [  # name, description, cents, regions
    ("gpu_1x_a100", "1x A100 (40 GB SXM4)", 129, [("us-east-1", "Virginia, USA")]),
    ("gpu_1x_a100_sxm4", "1x A100 (40 GB SXM4)", 129, [("us-west-1", "California, USA")]),
    ("gpu_8x_a100_80gb_sxm4", "8x A100 (80 GB SXM4)", 1432, [("us-east-1", "Virginia, USA")]),
    (
        "gpu_1x_h100_pcie",
        "1x H100 (80 GB PCIe)",
        249,
        [("us-west-3", "Utah, USA"), ("us-south-1", "Texas, USA")],
    ),
    ("gpu_8x_h100_sxm5", "8x H100 (80 GB SXM5)", 2392, []),  # no capacity now
    ("gpu_1x_a6000", "1x A6000 (48 GB)", 80, [("us-south-1", "Texas, USA")]),
    ("gpu_1x_rtx6000", "1x RTX 6000 (24 GB)", 50, [("us-south-1", "Texas, USA")]),  # Turing: dropped
    ("gpu_1x_a10", "1x A10 (24 GB PCIe)", 75, [("us-east-1", "Virginia, USA")]),  # unknown: dropped
    ("gpu_1x_gh200", "1x GH200 (96 GB)", 149, [("us-east-3", "Washington DC, USA")]),  # dropped
]


def _error(status: int, code: str, message: str, suggestion: str | None = None) -> Response:
    return Response(status, {"error": {"code": code, "message": message, "suggestion": suggestion}})


class FakeLambda(FakeCloud):
    provider = "lambda"
    url_suffix = "/api/v1"
    unhealthy_polls = 1  # status reads a VM on a failed host reads unhealthy before it reads terminated

    def unauthorized(self, req: Request) -> Response:
        return _error(
            401,
            "global/invalid-api-key",
            "API key was invalid, expired, or deleted.",
            "Check your API key or create a new one, then try again.",
        )

    def generate_offers(self, n: int, rng: random.Random) -> list[dict[str, Any]]:
        return [
            {"name": name, "description": desc, "cents": cents, "regions": regions}
            for name, desc, cents, regions in LAMBDA_TYPES
        ]

    def op_of(self, req: Request) -> str:
        p = req.path.removeprefix(self.url_suffix)
        if p.startswith("/instance-types"):
            return "search"
        if p.startswith("/instance-operations/launch"):
            return "create"
        if p.startswith("/instance-operations/terminate"):
            return "delete"
        if p == "/instances":
            return "list"
        if p.startswith("/instances/"):
            return "status"
        if p.startswith("/file-systems") or p.startswith("/filesystems"):
            return "volumes"
        return "other"

    def _type_json(self, t: dict[str, Any]) -> dict[str, Any]:
        count = int(t["description"].split("x", 1)[0])
        return {
            "name": t["name"],
            "description": t["description"],
            "gpu_description": t["description"][3:],
            "price_cents_per_hour": t["cents"],
            "specs": {
                "vcpus": 30 * count,
                "memory_gib": 200 * count,
                "storage_gib": 512 * count,
                "gpus": count,
            },
        }

    def route(self, req: Request, op: str) -> Response:
        p = req.path.removeprefix(self.url_suffix)
        if op == "search":
            return Response(
                200,
                {
                    "data": {
                        t["name"]: {
                            "instance_type": self._type_json(t),
                            "regions_with_capacity_available": [
                                {"name": r, "description": d} for r, d in t["regions"]
                            ],
                        }
                        for t in self.offers
                    }
                },
            )
        if op == "create":
            return self._launch(req.body or {})
        if op == "list":
            for inst in list(self.instances.values()):
                self._advance(inst, listing=True)
            return Response(200, {"data": [self._public(i) for i in self.instances.values()]})
        if op == "status":
            inst = self.instances.get(p.rsplit("/", 1)[-1])
            if inst is None:
                return _error(404, "global/object-does-not-exist", "Specified instance does not exist.")
            self._advance(inst)
            return Response(200, {"data": self._public(inst)})
        if op == "delete":
            ids = (req.body or {}).get("instance_ids") or []
            missing = [i for i in ids if i not in self.instances]
            if missing:
                return _error(404, "global/object-does-not-exist", "Specified instance does not exist.")
            out = []
            for iid in ids:
                inst = self.instances[iid]
                if inst["status"] not in ("terminating", "terminated"):
                    inst["status"] = "terminating"
                    inst["_gone_in"] = self.gone_polls
                out.append(self._public(inst))
            return Response(200, {"data": {"terminated_instances": out}})
        if op == "volumes":
            return self._file_systems(req, p)
        return _error(404, "global/object-does-not-exist", f"no route {req.method} {p}")

    def _launch(self, body: dict[str, Any]) -> Response:
        t = next((t for t in self.offers if t["name"] == body.get("instance_type_name")), None)
        if t is None or not body.get("region_name"):
            return _error(400, "global/invalid-parameters", "Invalid instance type or region.")
        if body.get("quantity", 1) != 1:
            return _error(400, "global/invalid-parameters", "quantity must be 1 here.")
        if body.get("region_name") not in [r for r, _ in t["regions"]]:
            return self.capacity_response(None)  # type: ignore[arg-type]
        if not str(body.get("user_data", "")).startswith("#cloud-config"):
            return _error(400, "global/invalid-parameters", "user_data must be a cloud-config document.")
        iid = uuid.uuid4().hex
        self.instances[iid] = {
            "id": iid,
            "name": body.get("name"),
            "status": "booting",
            "ip": None,
            "hostname": None,
            "region": {"name": body["region_name"], "description": ""},
            "instance_type": self._type_json(t),
            "file_system_names": body.get("file_system_names") or [],
            "ssh_key_names": body.get("ssh_key_names") or [],
            "_user_data": body.get("user_data"),
            "_polls": 0,
            "_gone_in": None,
            "_created": time.time(),
        }
        self.track_created(body.get("name"))
        return Response(200, {"data": {"instance_ids": [iid]}})

    def capacity_response(self, req: Request) -> Response:
        return _error(
            400,
            "instance-operations/launch/insufficient-capacity",
            "Not enough capacity to fulfill launch request.",
            "Choose an instance type with more availability.",
        )

    def _advance(self, inst: dict[str, Any], *, listing: bool = False) -> None:
        if inst["status"] in ("terminating", "terminated"):
            if listing:
                return
            inst["_gone_in"] -= 1
            if inst["_gone_in"] < 0:
                if inst["status"] == "terminated":
                    self.instances.pop(inst["id"], None)
                else:
                    inst["status"] = "terminated"
                    inst["_gone_in"] = 0
            return
        if inst["status"] == "unhealthy" and "_dead_in" in inst:
            if listing:
                return
            inst["_dead_in"] -= 1
            if inst["_dead_in"] < 0:
                inst["status"] = "terminated"
                inst["_gone_in"] = self.gone_polls
            return
        if listing:
            return
        inst["_polls"] += 1
        if inst["status"] == "booting" and inst["_polls"] > self.boot_polls:
            inst["status"] = "active"
            inst["ip"] = f"198.51.100.{len(self.instances) % 250}"

    def _public(self, inst: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in inst.items() if not k.startswith("_")}

    def _file_systems(self, req: Request, p: str) -> Response:
        if req.method == "GET":
            for fs in self.volumes.values():
                fs["is_in_use"] = any(
                    fs["name"] in i["file_system_names"]
                    for i in self.instances.values()
                    if i["status"] not in ("terminated",)
                )
            return Response(200, {"data": list(self.volumes.values())})
        if req.method == "POST":
            body = req.body or {}
            fid = uuid.uuid4().hex[:12]
            self.volumes[fid] = {
                "id": fid,
                "name": body.get("name"),
                "region": {"name": body.get("region")},
                "is_in_use": False,
                "bytes_used": 5 * 2**30,
                "created": "2026-11-30T10:00:00Z",
                "mount_point": f"/lambda/nfs/{body.get('name')}",
            }
            return Response(200, {"data": self.volumes[fid]})
        if req.method == "DELETE":
            fid = p.rsplit("/", 1)[-1]
            fs = self.volumes.get(fid)
            if fs is None:
                return _error(404, "global/object-does-not-exist", "Specified file system does not exist.")
            if any(fs["name"] in i["file_system_names"] for i in self.instances.values()):
                return _error(400, "filesystems/filesystem-in-use", "File system is in use.")
            del self.volumes[fid]
            return Response(200, {"data": {"deleted_ids": [fid]}})
        return Response(405, "method not allowed")

    # -- test controls -----------------------------------------------------------------------------
    def preempt(self, instance_id: str) -> None:
        """Lambda sells no spot; the closest event is a host failure. Its API has no "preempted" status
        (booting|active|unhealthy|terminating|terminated, docs/providers.md): the VM reads ``unhealthy``
        (which may still recover) for ``unhealthy_polls`` status reads, then ``terminated``."""
        with self.lock:
            inst = self.instances[instance_id]
            inst["status"] = "unhealthy"
            inst["_dead_in"] = self.unhealthy_polls

    def is_live(self, inst: dict[str, Any]) -> bool:
        return inst["status"] not in ("terminating", "terminated")

    def label_of(self, inst: dict[str, Any]) -> str | None:
        return inst.get("name")
