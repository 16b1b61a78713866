"""/dashboard in a real headless Chromium against a live CPU server with the tiny model.

While requests run, the page shows them: no console errors, the running count and the block map
follow requests as they start and finish, a request aborted by its client leaves the view, and
hovering a block highlights its request. A screenshot lands in the test's tmp dir (and in
docs/dashboard.png with FOLIO_UPDATE_SCREENSHOT=1). Skipped when no Chromium is installed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from folio.entrypoints.openai.cli_args import ServerConfig
from tests.helpers.chromium import Chromium, find_browser
from tests.server.harness import ServerThread, make_engine, wait_for
from tests.server.test_dashboard import Streamer, num_started, slow_steps

BROWSER = find_browser()
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium found (apt-get install chromium) for the browser test")

KEY = "sk-browser"
README_SHOT = Path(__file__).parents[2] / "docs" / "dashboard.png"


@pytest.fixture(scope="module")
def slow_server(checkpoint):
    engine = slow_steps(make_engine(checkpoint, max_num_seqs=3, max_waiting_requests=64, enable_prefix_caching=True,
                                    num_gpu_blocks_override=300))
    with ServerThread(engine, ServerConfig(api_key=KEY)) as running:
        yield running


@pytest.fixture
def browser():
    with Chromium(BROWSER) as chromium:
        yield chromium


def page_ids(browser, table: str) -> set[str]:
    return set(browser.evaluate(f"[...document.querySelectorAll('#{table} tbody tr')].map(r => r.dataset.requestId)"))


def text(browser, element_id: str) -> str:
    return browser.evaluate(f"document.getElementById('{element_id}').textContent")


def used_blocks(browser) -> int:
    return int(browser.evaluate("document.getElementById('block-map').dataset.used || '-1'"))


def test_the_page_follows_requests_as_they_start_finish_and_abort(slow_server, browser, tmp_path):
    browser.navigate(f"{slow_server.url}/dashboard#key={KEY}")
    browser.wait_for_js("Number(document.body.dataset.updates) >= 2", "the first updates")
    assert "key=" not in browser.evaluate("location.href")  # the key left the address bar
    assert text(browser, "num-running") == "0" and used_blocks(browser) == 0

    model = slow_server.engine.model_config.served_model_name
    streams = [Streamer(slow_server, model, headers={"Authorization": f"Bearer {KEY}"})
               for _ in range(4)]  # 3 run, 1 waits for a seat
    try:
        wait_for(lambda: num_started(streams) == 3, "three requests to run")
        running = {s.id for s in streams if s.id is not None}
        browser.wait_until(lambda: page_ids(browser, "running") == running, "the page to list the running requests")
        browser.wait_until(lambda: text(browser, "num-running") == "3" and used_blocks(browser) >= 3,
                           "the count and the block map to show them")
        browser.wait_until(lambda: len(page_ids(browser, "waiting")) == 1, "the fourth request to wait")
        assert browser.evaluate("document.querySelector('#waiting tbody td:nth-child(4)').textContent") in (
            "max_num_seqs", "arrived")
        # They share the prompt's first blocks through the prefix cache.
        browser.wait_for_js("Number(document.getElementById('block-map').dataset.shared) >= 2", "shared blocks")
        before = used_blocks(browser)
        browser.wait_until(lambda: used_blocks(browser) > before, "the block map to grow as they decode")

        victim = next(s for s in streams if s.id in running)
        victim.close()
        browser.wait_until(lambda: victim.id not in page_ids(browser, "running") | page_ids(browser, "waiting"),
                           "the aborted request to leave the page")
        wait_for(lambda: num_started(streams) == 4, "the waiting request to start")
        browser.wait_until(lambda: page_ids(browser, "running") == {s.id for s in streams if s is not victim},
                           "the page to show the request that took its seat")
        browser.wait_for_js("window.folioDashboard.state.series.generation_tokens_per_s.filter(x => x > 0).length >= 2",
                            "two seconds of throughput in the sparklines")
        shot = tmp_path / "dashboard.png"
        browser.screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        if os.environ.get("FOLIO_UPDATE_SCREENSHOT"):
            shutil.copyfile(shot, README_SHOT)
        _hover_a_used_block(browser)

    finally:
        for s in streams:
            s.close()
    browser.wait_until(lambda: text(browser, "num-running") == "0" and used_blocks(browser) == 0,
                       "the page to show an idle engine")
    assert browser.errors == []


def _hover_a_used_block(browser) -> None:
    """Hover the first block of a listed running request: its row lights up, the tooltip names
    it, and its blocks stay bright while the rest dims, also when the last update carried no
    block map (the map the page shows may be up to a second older than the rows)."""
    browser.wait_for_js("window.folioDashboard.state.mapQueues !== window.folioDashboard.state.queues",
                        "an update without a block map")
    browser.evaluate("document.getElementById('paused').click()")  # no update redraws after the hover
    first = browser.evaluate("""(() => { const m = document.getElementById('block-map');
        const rows = new Set([...document.querySelectorAll('#running tbody tr')].map(r => r.dataset.requestId));
        const [i, ids] = [...window.folioDashboard.owners].filter(([, ids]) => ids.some(id => rows.has(id)))
                                                          .sort((a, b) => a[0] - b[0])[0];
        const r = m.getBoundingClientRect(), size = +m.dataset.size, cols = +m.dataset.cols;
        return {x: r.left + (i % cols) * size + size / 2, y: r.top + Math.floor(i / cols) * size + size / 2,
                owner: ids.find(id => rows.has(id))}; })()""")
    browser.mouse_move(first["x"], first["y"])
    browser.wait_for_js("!document.getElementById('tooltip').hidden", "the tooltip")
    assert first["owner"] in text(browser, "tooltip")
    browser.wait_for_js(f"[...document.querySelectorAll('tr.hot')].some(r => r.dataset.requestId === {first['owner']!r})",
                        "the hovered request's row to light up")
    pixel = browser.evaluate(f"""(() => {{ const m = document.getElementById('block-map');
        const d = m.getContext('2d').getImageData({first['x']} - m.getBoundingClientRect().left,
                                                  {first['y']} - m.getBoundingClientRect().top, 1, 1).data;
        return Array.from(d); }})()""")
    assert pixel[3] == 255, pixel  # opaque: not dimmed
    browser.evaluate("document.getElementById('paused').click()")


def test_a_wrong_key_asks_for_the_right_one(slow_server, browser):
    browser.navigate(f"{slow_server.url}/dashboard?key=sk-wrong")
    browser.wait_for_js("!document.getElementById('key-form').hidden", "the key form")
    assert "refused" in text(browser, "key-error")
    browser.evaluate(f"document.getElementById('key-input').value = {KEY!r}; "
                     "document.getElementById('key-form').requestSubmit()")
    browser.wait_for_js("Number(document.body.dataset.updates) >= 1", "updates with the right key")
    # The refused stream logs one failed load (401); nothing else may fail.
    assert [e for e in browser.errors if "401" not in e] == []
