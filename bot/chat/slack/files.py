"""Files uploaded to Slack as a job's dataset (or config.json): `dataset=slack:F0123ABCD` or the file's link.

The bot asks Slack's files API (``files.info``, scope ``files:read``) for the file, checks that the person
may use it (they uploaded it, or it was shared in the channel they typed in), that it is not larger than
TUNEBOT_SLACK_MAX_FILE_MB, then downloads ``url_private_download`` with the bot token into
``<data dir>/slack-files/<file id>/`` and hands that path on. The download is streamed and capped; the
token goes only to Slack's own file host (or the configured fake API's host in tests).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bot.planner.sources import SourceError

CHUNK = 1 << 16


class SlackFiles:
    def __init__(
        self,
        client: Any,  # slack_sdk WebClient (synchronous: the chat handlers run in worker threads)
        *,
        token: str,
        folder: Path,
        max_bytes: int = 512 << 20,
        timeout_s: float = 60.0,
    ) -> None:
        self.client = client
        self.token = token
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        api = urlparse(str(getattr(client, "base_url", "") or "https://slack.com/api/"))
        self.hosts = {"files.slack.com", api.hostname or "slack.com"}

    @classmethod
    def from_settings(cls, settings: Any, client: Any) -> SlackFiles:
        return cls(
            client,
            token=settings.slack_bot_token.get_secret_value() if settings.slack_bot_token else "",
            folder=Path(settings.data_dir) / "slack-files",
            max_bytes=int(settings.slack_max_file_mb * (1 << 20)),
        )

    def fetch(self, file_id: str, user: str, channel: str | None) -> Path:
        """The local copy of a Slack file the person may use; SourceError (a friendly refusal) otherwise."""
        from slack_sdk.errors import SlackApiError

        try:
            info = self.client.files_info(file=file_id)
        except SlackApiError as exc:
            error = (getattr(exc, "response", None) or {}).get("error", "error")
            raise SourceError(f"Slack file {file_id}: not available to the bot ({error})") from None
        file: dict[str, Any] = info.get("file") or {}
        shared = set(file.get("channels") or []) | set(file.get("groups") or []) | set(file.get("ims") or [])
        if file.get("user") != user and (channel is None or channel not in shared):
            raise SourceError(
                f"Slack file {file_id}: share it in this channel (or upload it yourself) to use it"
            )
        size = int(file.get("size") or 0)
        if size > self.max_bytes:
            raise SourceError(
                f"Slack file {file_id} is {size / 2**20:.0f} MB; the limit is "
                f"{self.max_bytes / 2**20:.0f} MB "
                "(TUNEBOT_SLACK_MAX_FILE_MB): put larger data in object storage"
            )
        url = str(file.get("url_private_download") or file.get("url_private") or "")
        if urlparse(url).hostname not in self.hosts or urlparse(url).scheme not in ("https", "http"):
            raise SourceError(f"Slack file {file_id}: no download link from Slack")
        name = re.sub(r"[^\w.\-]+", "_", str(file.get("name") or "data.jsonl"))[:120].lstrip(".") or "data"
        target = self.folder / file_id / name
        if target.is_file() and target.stat().st_size == size:
            return target
        self._download(url, target, file_id, size)
        return target

    def _download(self, url: str, target: Path, file_id: str, size: int) -> None:
        """Stream the file's bytes as stored to disk, never more than Slack said it holds nor the size
        limit. No transfer encoding is accepted: a client that decodes gzip expands each network chunk
        whole, so 299 KB sent gzip-encoded would arrive as a 300 MB file (and a 300 MB line in memory)."""
        import httpx

        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        got = 0
        cap = min(self.max_bytes, size) if size > 0 else self.max_bytes
        try:
            with httpx.stream(
                "GET",
                url,
                headers={"Authorization": f"Bearer {self.token}", "Accept-Encoding": "identity"},
                timeout=self.timeout_s,
                follow_redirects=False,
            ) as resp:
                if resp.status_code != 200:
                    raise SourceError(f"Slack file {file_id}: download refused (HTTP {resp.status_code})")
                encoding = resp.headers.get("content-encoding", "identity").strip().lower()
                if encoding not in ("", "identity"):
                    raise SourceError(
                        f"Slack file {file_id}: the download came {encoding[:20]}-encoded, not as the file's "
                        "own bytes; upload the file itself (as .jsonl.gz to have it compressed)"
                    )
                with partial.open("wb") as out:
                    for chunk in resp.iter_raw(CHUNK):
                        got += len(chunk)
                        if got > cap:
                            raise SourceError(
                                f"Slack file {file_id}: the download is larger than "
                                + (f"the {size:,} bytes Slack lists for it" if cap == size else "the limit")
                                + " (TUNEBOT_SLACK_MAX_FILE_MB)"
                            )
                        out.write(chunk)
        except httpx.HTTPError as exc:
            partial.unlink(missing_ok=True)
            raise SourceError(f"Slack file {file_id}: download failed ({type(exc).__name__})") from None
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        partial.replace(target)
