"""Fake RunPod GraphQL API: errors with HTTP 200, null stockStatus, runtime null until up."""

from __future__ import annotations

import random
import time
from typing import Any

from .base import FakeCloud, Request, Response

RUNPOD_GPUS: list[tuple[str, str, int, float, int]] = [  # id, displayName, memoryInGb, $/GPU/h, max count
    ("NVIDIA GeForce RTX 3090", "RTX 3090", 24, 0.22, 4),
    ("NVIDIA GeForce RTX 4090", "RTX 4090", 24, 0.34, 8),
    ("NVIDIA RTX A6000", "RTX A6000", 48, 0.49, 8),
    ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada", 48, 0.77, 8),
    ("NVIDIA L40S", "L40S", 48, 0.86, 8),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe", 80, 1.64, 8),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM", 80, 1.89, 8),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 80, 2.99, 8),
    ("NVIDIA H200", "H200 SXM", 141, 3.99, 8),
    ("NVIDIA L4", "L4", 24, 0.43, 8),  # unknown to tunebot: dropped
    ("NVIDIA RTX A4000", "RTX A4000", 16, 0.32, 8),  # unknown: dropped
]

CAPACITY_MESSAGE = (
    "There are no longer any instances available with the requested specifications. "
    "Please refresh and try again."
)


class FakeRunPod(FakeCloud):
    provider = "runpod"

    def __init__(self, **kwargs: Any) -> None:
        self.unavailable: set[str] = set()  # gpu ids whose stockStatus is null
        super().__init__(**kwargs)

    def authorized(self, req: Request) -> bool:
        return req.bearer == self.api_key or req.query.get("api_key") == self.api_key

    def unauthorized(self, req: Request) -> Response:
        return Response(401, {"errors": [{"message": "Unauthorized"}]})

    def generate_offers(self, n: int, rng: random.Random) -> list[dict[str, Any]]:
        types = []
        for k, (gid, name, mem, price, max_count) in enumerate(RUNPOD_GPUS):
            stock = None if k % 5 == 4 else rng.choice(["High", "Medium", "Low"])
            types.append(
                {
                    "id": gid,
                    "displayName": name,
                    "memoryInGb": mem,
                    "maxGpuCount": max_count,
                    "secureCloud": True,
                    "communityCloud": k % 2 == 0,
                    "securePrice": price,
                    "communityPrice": round(price * 0.8, 3),
                    "_price": price,
                    "_stock": stock,
                }
            )
        return types

    def op_of(self, req: Request) -> str:
        q = str((req.body or {}).get("query") if isinstance(req.body, dict) else "")
        if "podFindAndDeployOnDemand" in q:
            return "create"
        if "podTerminate" in q:
            return "delete"
        if "gpuTypes" in q:
            return "search"
        if "pod(" in q:
            return "status"
        if "networkVolumes" in q or "NetworkVolume" in q:
            return "volumes"
        if "pods" in q:
            return "list"
        if "currentSpendPerHr" in q:
            return "billing"
        return "other"

    @staticmethod
    def _err(message: str) -> Response:
        return Response(200, {"errors": [{"message": message, "path": ["x"]}], "data": None})

    def route(self, req: Request, op: str) -> Response:
        if req.path != "/graphql" or req.method != "POST" or not isinstance(req.body, dict):
            return Response(404, "Not Found")
        v = req.body.get("variables") or {}
        inp = v.get("input") or {}
        if op == "search":
            count = int(inp.get("gpuCount") or 1)
            out = []
            for t in self.offers:
                stock = None if t["id"] in self.unavailable else t["_stock"]
                lowest = {
                    "uninterruptablePrice": t["_price"] if stock else None,
                    "minimumBidPrice": None,
                    "minVcpu": 8 * count,
                    "minMemory": 32 * count,
                    "stockStatus": stock,
                }
                out.append({**{k: v for k, v in t.items() if not k.startswith("_")}, "lowestPrice": lowest})
            return Response(200, {"data": {"gpuTypes": out}})
        if op == "create":
            return self._create(inp)
        if op == "status":
            pod = self.instances.get(str(inp.get("podId")))
            if pod is None:
                return Response(200, {"data": {"pod": None}})
            self._advance(pod)
            return Response(200, {"data": {"pod": self._public(pod)}})
        if op == "list":
            pods = [self._public(p) for p in self.instances.values()]
            return Response(200, {"data": {"myself": {"pods": pods}}})
        if op == "delete":
            pod = self.instances.get(str(inp.get("podId")))
            if pod is None:
                return self._err("pod not found to terminate")
            pod["desiredStatus"] = "TERMINATED"
            pod["_gone_in"] = self.gone_polls
            return Response(200, {"data": {"podTerminate": None}})
        if op == "volumes":
            return self._volumes(req.body.get("query", ""), inp)
        if op == "billing":
            spend = sum(p["costPerHr"] for p in self.instances.values() if p["desiredStatus"] == "RUNNING")
            return Response(
                200,
                {
                    "data": {
                        "myself": {
                            "clientBalance": 25.0,
                            "currentSpendPerHr": round(spend, 6),
                            "spendLimit": 80,
                        }
                    }
                },
            )
        return self._err(f"Cannot query field on type Query ({op})")

    def _create(self, inp: dict[str, Any]) -> Response:
        gpu = next((t for t in self.offers if t["id"] == inp.get("gpuTypeId")), None)
        if not inp.get("imageName"):
            return self._err("imageName is required")
        if gpu is None or gpu["id"] in self.unavailable or gpu["_stock"] is None:
            return self._err(CAPACITY_MESSAGE)
        count = int(inp.get("gpuCount") or 1)
        pid = f"pod{self.new_id()}x"
        pod = {
            "id": pid,
            "name": inp.get("name"),
            "desiredStatus": "RUNNING",
            "costPerHr": round(gpu["_price"] * count, 6),
            "gpuCount": count,
            "lastStatusChange": f"Rented by User: {time.ctime()}",
            "networkVolumeId": inp.get("networkVolumeId"),
            "runtime": None,
            "machine": {"podHostId": f"{pid}-host", "gpuDisplayName": gpu["displayName"]},
            "env": inp.get("env"),
            "_polls": 0,
            "_gone_in": None,
        }
        self.instances[pid] = pod
        self.track_created(pod["name"])
        return Response(
            200,
            {
                "data": {
                    "podFindAndDeployOnDemand": {
                        "id": pid,
                        "name": pod["name"],
                        "desiredStatus": "RUNNING",
                        "costPerHr": pod["costPerHr"],
                        "machine": {"podHostId": f"{pid}-host"},
                    }
                }
            },
        )

    def capacity_response(self, req: Request) -> Response:
        return self._err(CAPACITY_MESSAGE)

    def _advance(self, pod: dict[str, Any]) -> None:
        if pod["desiredStatus"] == "TERMINATED":
            if pod["_gone_in"] is not None:
                pod["_gone_in"] -= 1
                if pod["_gone_in"] < 0:
                    self.instances.pop(pod["id"], None)
            return
        if pod["desiredStatus"] != "RUNNING":
            return
        pod["_polls"] += 1
        if pod["_polls"] > self.boot_polls and pod["runtime"] is None:
            pod["runtime"] = {"uptimeInSeconds": 1}

    def _public(self, pod: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in pod.items() if not k.startswith("_") and k != "env"}

    def _volumes(self, query: str, inp: dict[str, Any]) -> Response:
        if "createNetworkVolume" in query:
            vid = f"vol{self.new_id()}"
            self.volumes[vid] = {
                "id": vid,
                "name": inp.get("name"),
                "size": inp.get("size"),
                "dataCenterId": inp.get("dataCenterId"),
            }
            return Response(200, {"data": {"createNetworkVolume": {"id": vid}}})
        if "deleteNetworkVolume" in query:
            if self.volumes.pop(str(inp.get("id")), None) is None:
                return self._err("Network volume not found")
            return Response(200, {"data": {"deleteNetworkVolume": None}})
        pods = [{"id": p["id"], "networkVolumeId": p["networkVolumeId"]} for p in self.instances.values()]
        return Response(
            200, {"data": {"myself": {"networkVolumes": list(self.volumes.values()), "pods": pods}}}
        )

    # -- test controls -----------------------------------------------------------------------------
    def preempt(self, instance_id: str) -> None:
        """The host went away: the pod exits (RunPod sells no spot now, so this is a host failure)."""
        with self.lock:
            pod = self.instances[str(instance_id)]
            pod["desiredStatus"] = "EXITED"
            pod["runtime"] = None

    def is_live(self, inst: dict[str, Any]) -> bool:
        return inst["desiredStatus"] != "TERMINATED"

    def label_of(self, inst: dict[str, Any]) -> str | None:
        return inst.get("name")
