"""Read the stored history: through the running stack, from the embedded store, or a server."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

from dsec.infra.store.clickhouse import StoreLockedError, connect
from dsec.infra.store.query_server import run_readonly
from dsec.schemas.settings import DsecSettings
from dsec.services.stack import read_stack_state


class HistoryError(RuntimeError):
    """The query failed, or no store could be reached; the message says what to do."""


def query(
    settings: DsecSettings, sql: str, parameters: dict | None = None, timeout_s: float = 60.0
) -> dict:
    """``{"columns": [...], "rows": [[...], ...]}`` for a read-only query; ``parameters``
    fill ClickHouse placeholders such as ``{job:String}``."""
    state = None if settings.clickhouse_dsn else read_stack_state(settings.data_dir)
    if state is not None:
        return _query_stack(state, sql, parameters or {}, timeout_s)
    try:
        client = connect(settings.clickhouse_target())
    except StoreLockedError as exc:
        raise HistoryError(
            f"{exc}. No running stack left its address in {settings.data_dir / 'stack.json'}: "
            "run the query with the same --data-dir as the stack, or stop the stack first."
        ) from None
    try:
        return run_readonly(client, threading.Lock(), sql, parameters)
    except Exception as exc:
        raise HistoryError(str(exc)) from None
    finally:
        client.close()


def _query_stack(state: dict, sql: str, parameters: dict, timeout_s: float) -> dict:
    body = json.dumps({"sql": sql, "parameters": parameters}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{state['query_port']}/query", data=body, method="POST",
        headers={"Authorization": f"Bearer {state['query_token']}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise HistoryError(json.loads(exc.read()).get("error", str(exc))) from None
    except urllib.error.URLError as exc:
        raise HistoryError(f"the running stack did not answer: {exc.reason}") from None
