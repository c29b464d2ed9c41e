"""``stalwart dashboard``: a web UI and JSON API over the ledgers of one run or a directory of runs.

Served by :mod:`.httpd` (loopback by default; its timeouts, connection cap and body limit). Every
read is served from a watcher's latest snapshot (a background thread per run follows its ledgers),
so a request never parses a ledger.

Who may ask: a request whose ``Host`` header names another host is refused (403) before anything
else, so a page of another site that rebinds its DNS name to this address cannot read the API. The
API needs the token, for reads too (ledgers hold command lines, host names and stacks): as
``Authorization: Bearer <token>``, or as the cookie that ``GET /login?token=<token>`` sets for the
browser (HttpOnly, SameSite=Strict) before it redirects to the page. The page and its assets hold no
data and need none. The only write (an annotation on a run) needs the header itself, never the
cookie (no cross-site write). Bad query parameters get a 400 with a one-line JSON ``error``; a
corrupt ledger becomes an ``error`` field that the UI shows as a banner. Every asset is served from
the package (no CDN).
"""

from __future__ import annotations

import hmac
import json
import mimetypes
import os
import re
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from ..errors import ConfigError
from ..policy.label import Label
from .httpd import LOOPBACK, HttpError, HttpServer, Limits, Reply, Request, is_loopback
from .snapshot import RunSnapshot
from .watcher import RunWatcher

STATIC = Path(__file__).with_name("static")
MAX_BODY = 64 * 1024
COOKIE = "stalwart_dashboard"
_RUN_ID = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}$")


def allowed_hosts(addr: str, extra: tuple[str, ...] = ()) -> frozenset[str]:
    """The names a request's ``Host`` may give: the loopback names, and beyond loopback the bound
    address, this machine's names and ``extra`` (``--allow-host``)."""
    names = {"127.0.0.1", "localhost", "::1"}
    if not is_loopback(addr):
        names |= {addr, socket.gethostname(), socket.getfqdn()}
    return frozenset(n.strip("[]").lower() for n in names | set(extra) if n)


class Listing(Label):
    """What the run list shows instead of a job outcome while it cannot show one."""

    LOADING = "loading"  # the watcher has not read the whole ledger yet
    UNREADABLE = "unreadable"  # no JobStarted could be read


def _listed_outcome(loading: bool, snap: RunSnapshot) -> str:
    if loading:
        return Listing.LOADING
    if snap.error and not snap.started:
        return Listing.UNREADABLE
    return snap.outcome


def discover(root: Path) -> dict[str, Path]:
    """Run directories under ``root``: itself if it holds a ledger, else its sub-directories that do."""
    if (root / "ledger").is_dir():
        return {root.name: root}
    return {
        p.name: p
        for p in sorted(root.iterdir())
        if p.is_dir() and (p / "ledger").is_dir() and _RUN_ID.match(p.name)
    }


# Any: a JSON document of any shape (json.dumps)
def snapshot_json(snap: RunSnapshot, series: list[tuple[float, float]], *, loading: bool) -> dict[str, Any]:
    ck = snap.checkpoints
    return {
        "run_id": snap.run_id,
        "now": snap.now,
        "events": snap.events,
        "loading": loading,
        "started": snap.started,
        "finished": snap.finished,
        "outcome": snap.outcome,
        "verdict": snap.verdict,
        "wall_s": snap.wall_s,
        "goodput": snap.goodput,
        "buckets_s": snap.buckets,
        "ideal_step_s": snap.ideal_step_s,
        "steps_completed": snap.steps_completed,
        "interruptions": list(snap.interruptions),
        "restarts_by_cause": snap.restarts_by_cause,
        "incidents_by_class": snap.incidents_by_class,
        "mtbf_job_hours": snap.mtbf_job_hours,
        "mttr_s": snap.mttr_s,
        "checkpoints": None
        if ck is None
        else {
            "committed": ck.committed,
            "rejected": ck.rejected,
            "newest_step": ck.newest_step,
            "newest_ts": ck.newest_ts,
            "newest_path": ck.newest_path,
            "mean_stall_s": sum(ck.stall_s) / len(ck.stall_s) if ck.stall_s else None,
            "mean_persist_s": sum(ck.persist_s) / len(ck.persist_s) if ck.persist_s else None,
            "restores": len(ck.restore_s),
            "script_resumes": list(ck.script_resumes),
        },
        "ranks": [
            {k: v for k, v in asdict(r).items() if k != "recent_steps"}
            | {"heat": [list(x) for x in r.recent_steps]}
            for r in snap.ranks
        ],
        "nodes": [asdict(n) for n in snap.nodes],
        "goodput_series": [list(p) for p in series],
        "error": snap.error,
    }


class Dashboard:
    def __init__(
        self,
        root: str | Path,
        *,
        token: str,
        addr: str = LOOPBACK,
        port: int = 0,
        interval_s: float = 1.0,
        allow_hosts: tuple[str, ...] = (),
    ) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise ConfigError(
                f"{self.root} is not a directory", "pass a run directory or a directory of runs"
            )
        if len(token) < 16:
            raise ConfigError("the dashboard token must have at least 16 characters")
        self.token = token
        self.interval_s = interval_s
        self._watchers: dict[str, RunWatcher] = {}
        self._lock = threading.Lock()
        self.hosts = allowed_hosts(addr, allow_hosts)
        self.server = HttpServer(
            self.handle, addr=addr, port=port, limits=Limits(max_body=MAX_BODY), name="stalwart-dashboard"
        )

    # --- runs ----------------------------------------------------------------------------------

    def watcher(self, run_id: str) -> RunWatcher:
        if not _RUN_ID.match(run_id):
            raise HttpError(400, f"run id {run_id!r} is not valid (letters, digits, . _ -)")
        with self._lock:
            w = self._watchers.get(run_id)
            if w is None:
                runs = discover(self.root)
                if run_id not in runs:
                    raise HttpError(404, f"no run {run_id!r} under {self.root}")
                w = self._watchers[run_id] = RunWatcher(runs[run_id], interval_s=self.interval_s).start()
            return w

    def runs(self) -> list[dict[str, Any]]:  # Any: a JSON document of any shape (json.dumps)
        out = []
        for run_id in discover(self.root):
            w = self.watcher(run_id)
            s = w.snapshot()
            out.append(
                {
                    "id": run_id,
                    "run_id": s.run_id,
                    "outcome": _listed_outcome(w.loading, s),
                    "goodput": s.goodput,
                    "steps_completed": s.steps_completed,
                    "interruptions": len(s.interruptions),
                    "wall_s": s.wall_s,
                    "events": s.events,
                    "loading": w.loading,
                    "error": s.error,
                }
            )
        return out

    # --- routing -------------------------------------------------------------------------------

    def handle(self, req: Request) -> Reply:
        """One request: the page and its assets, or the JSON API."""
        self._check_host(req.headers.get("Host", ""))
        parts = urlsplit(req.target)
        path = parts.path
        try:
            query = parse_qs(
                parts.query, keep_blank_values=True, strict_parsing=bool(parts.query), max_num_fields=20
            )
        except ValueError as exc:
            raise HttpError(400, f"malformed query string: {exc}") from None
        if req.method == "GET" and (path == "/" or path.startswith("/static/")):
            return self._static("index.html" if path == "/" else unquote(path[len("/static/") :]))
        if req.method == "GET" and path == "/login":
            return self._login(query)
        segs = [unquote(s) for s in path.split("/") if s]  # split first: %2F never separates
        if not segs or segs[0] != "api":
            raise HttpError(404, f"no page {path}")
        self._check_token(req.headers, cookie_ok=req.method == "GET")
        code, obj = self._api(req.method, path, segs[1:], query, req.body)
        return Reply.json(code, obj)

    def _api(
        self, method: str, path: str, api: list[str], query: dict[str, list[str]], body: bytes
    ) -> tuple[int, Any]:  # Any: a JSON document of any shape (json.dumps)
        if method == "GET" and api == ["runs"]:
            return 200, {"root": str(self.root), "runs": self.runs()}
        if method == "GET" and api == ["cluster"]:
            return 200, self.cluster()
        if len(api) >= 2 and api[0] == "runs":
            w = self.watcher(api[1])
            if method == "GET" and len(api) == 2:
                return 200, snapshot_json(w.snapshot(), w.series(), loading=w.loading)
            if method == "GET" and api[2:] == ["events"]:
                return 200, self.events(w, query)
            if api[2:] == ["annotations"]:
                if method == "POST":
                    return 201, self.annotate(w, body)
                return 200, {"annotations": self.annotations(w)}
        raise HttpError(404 if method == "GET" else 405, f"no {method} endpoint {path}")

    def _check_host(self, host: str) -> None:
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name.strip("[]").lower() not in self.hosts:
            raise HttpError(
                403,
                f"Host {host[:100]!r} is not this dashboard's (a rebound DNS name?); "
                "use its own address, or start it with --allow-host NAME",
            )

    def _check_token(self, headers: Mapping[str, str], *, cookie_ok: bool) -> None:
        auth = headers.get("Authorization", "")
        given = auth[len("Bearer ") :] if auth.startswith("Bearer ") else ""
        if not given and cookie_ok:
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(headers.get("Cookie", ""))
            except CookieError:
                pass
            given = jar[COOKIE].value if COOKIE in jar else ""
        if not given:
            raise HttpError(
                401,
                "send 'Authorization: Bearer <token>'"
                + (" or open /login?token=<token> in the browser first" if cookie_ok else ""),
            )
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise HttpError(403, "wrong token")

    def _login(self, query: dict[str, list[str]]) -> Reply:
        given = (query.get("token") or [""])[-1]
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise HttpError(403, "wrong token: use the login URL `stalwart dashboard` printed")
        cookie = f"{COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"
        return Reply(303, b"", "text/plain", {"Location": "/", "Set-Cookie": cookie})

    def _static(self, name: str) -> Reply:
        if not re.fullmatch(r"[a-z0-9_-]+\.(html|js|css|svg)", name):
            raise HttpError(404, f"no asset {name}")
        f = STATIC / name
        if not f.is_file():
            raise HttpError(404, f"no asset {name}")
        ctype = (mimetypes.guess_type(name)[0] or "application/octet-stream") + "; charset=utf-8"
        return Reply(200, f.read_bytes(), ctype)

    def cluster(self) -> dict[str, Any]:  # Any: a JSON document of any shape (json.dumps)
        nodes: dict[str, dict[str, Any]] = {}
        for run in self.runs():
            s = self.watcher(run["id"]).snapshot()
            for n in s.nodes:
                nodes[n.node] = asdict(n) | {"run": run["id"]}
            for r in s.ranks:
                nodes.setdefault(
                    r.node,
                    {"node": r.node, "state": "unknown", "drained": False, "findings": [], "run": run["id"]},
                )
        return {"nodes": sorted(nodes.values(), key=lambda n: n["node"])}

    @staticmethod
    def _int(query: dict[str, list[str]], name: str, default: int, lo: int, hi: int) -> int:
        vals = query.get(name)
        if not vals:
            return default
        try:
            v = int(vals[-1])
        except ValueError:
            raise HttpError(400, f"query parameter {name}={vals[-1]!r} must be an integer") from None
        if not lo <= v <= hi:
            raise HttpError(400, f"query parameter {name}={v} must be between {lo} and {hi}")
        return v

    # Any: a JSON document of any shape (json.dumps)
    def events(self, w: RunWatcher, query: dict[str, list[str]]) -> dict[str, Any]:
        unknown = set(query) - {"limit", "offset", "kind"}
        if unknown:
            raise HttpError(
                400, f"unknown query parameter(s): {', '.join(sorted(unknown))} (use limit, offset, kind)"
            )
        limit = self._int(query, "limit", 100, 1, 1000)
        offset = self._int(query, "offset", 0, 0, 10**9)
        kind = (query.get("kind") or [""])[-1]
        if kind and not re.fullmatch(r"[A-Za-z]{1,64}", kind):
            raise HttpError(
                400, f"query parameter kind={kind!r} must be an event kind such as FailureDetected"
            )
        evs = w.tail.events()
        if kind:
            evs = [e for e in evs if e.kind == kind or getattr(e, "raw_kind", "") == kind]
        newest_first = evs[::-1][offset : offset + limit]
        return {
            "total": len(evs),
            "events": [{"kind": getattr(e, "raw_kind", e.kind)} | e.to_payload() for e in newest_first],
        }

    def _annotations_file(self, w: RunWatcher) -> Path:
        return w.run_dir / "annotations.jsonl"

    # Any: a JSON document of any shape (json.dumps)
    def annotations(self, w: RunWatcher) -> list[dict[str, Any]]:
        f = self._annotations_file(w)
        if not f.is_file():
            return []
        out = []
        for line in f.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    # Any: a JSON document of any shape (json.dumps)
    def annotate(self, w: RunWatcher, body: bytes) -> dict[str, Any]:
        try:
            data = json.loads(body or b"null")
        except ValueError:
            raise HttpError(400, 'the body must be JSON like {"text": "..."}') from None
        text = data.get("text") if isinstance(data, dict) else None
        if not isinstance(text, str) or not 0 < len(text.strip()) <= 2000:
            raise HttpError(400, "'text' must be a non-empty string of at most 2000 characters")
        note = {"ts": time.time(), "text": text.strip()}
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
        with self._lock, open(os.open(self._annotations_file(w), flags, 0o600), "a") as f:
            f.write(json.dumps(note) + "\n")
        return note

    # --- server --------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.server.url("/")

    @property
    def login_url(self) -> str:
        """The URL that signs a browser in (sets the token's cookie) and opens the page."""
        return self.server.url(f"/login?{urlencode({'token': self.token})}")

    def start(self) -> Dashboard:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()
        for w in self._watchers.values():
            w.stop()
