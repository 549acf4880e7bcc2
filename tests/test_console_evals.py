"""The console's Evals page, in a real browser (Debian's chromium driven by Playwright): two
evals run on the workers of `minions serve` (``minions eval --durable``), the second against
the first as its baseline, one case of it flaky and regressed. The service lists the kept
reports (``GET /evals``, ``GET /evals/{id}``); the page shows each case's pass rate and
marks, each case run opens its run page, and the regressed case opens the diff of its failed
run against the baseline's run. Screenshots go to the test's folder (to docs/ with
``MINIONS_SCREENSHOTS=docs``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from browser_helpers import launch
from evals_helpers import Alternating, write
from playwright.sync_api import Browser, expect, sync_playwright
from runs_helpers import minions
from service_helpers import TOKEN, auth, server
from test_console import log_in

from minions.evals import EvalReport
from minions.testing import FakeOpenAIServer

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parent.parent / "docs"

DATASET = """\
recipe: capital.yaml
repeat: 2
cases:
  - id: france
    inputs: {country: France}
    expected: Paris
  - id: japan
    inputs: {country: Japan}
    expected: Tokyo
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:  # one chromium for the module, as test_console's
        browser = launch(playwright)
        yield browser
        browser.close()


def test_a_person_reads_kept_eval_reports_and_opens_a_regressed_cases_diff(
    browser: Browser, tmp_path: Path
) -> None:
    folder = tmp_path / "evals"
    write(folder, DATASET)
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    shots = DOCS if os.environ.get("MINIONS_SCREENSHOTS") == "docs" else tmp_path
    answers = Alternating(flaky=())
    with FakeOpenAIServer(answers.reply) as model:
        env = {
            "MINIONS_MODEL": f"openai-compatible:fake-model@{model.url}",
            "OPENAI_API_KEY": "sk-test",
        }
        with (
            server(tmp_path, url, **env) as service,
            httpx2.Client(base_url=service.base, headers=auth(), timeout=60) as client,
        ):
            assert client.get("/evals").json() == {"evals": [], "next_cursor": None}
            durable = ["eval", "capitals.yaml", "--durable", "--database-url", url]
            first = minions(*durable, "--out", "base.json", "-q", cwd=folder)
            assert first.returncode == 0, first.stderr
            answers.flaky = ("France",)  # France's next two answers: right, then wrong
            second = minions(
                *durable, "--baseline", "base.json", "--max-regressions", "0", "--json",
                cwd=folder,
            )  # fmt: skip
            assert second.returncode == 1, second.stderr
            report = EvalReport.model_validate_json(second.stdout)
            base = EvalReport.load(folder / "base.json")
            france = report.case("france")
            assert (france.baseline, france.flaky, france.passed) == ("regressed", True, 1)
            assert france.baseline_run_id in base.case("france").run_ids

            # The service: the kept evals, newest first; one with its report.
            listed = client.get("/evals").json()["evals"]
            assert [e["eval_id"] for e in listed] == [report.eval_id, base.eval_id]
            assert listed[0]["summary"]["regressed"] == 1
            assert listed[0]["summary"]["flaky"] == 1
            assert listed[0]["summary"]["ok"] is False
            assert listed[1]["summary"]["ok"] is True
            page_one = client.get("/evals", params={"limit": 1}).json()
            assert [e["eval_id"] for e in page_one["evals"]] == [report.eval_id]
            page_two = client.get("/evals", params={"cursor": page_one["next_cursor"]}).json()
            assert [e["eval_id"] for e in page_two["evals"]] == [base.eval_id]
            detail = client.get(f"/evals/{report.eval_id}").json()
            assert EvalReport.model_validate(detail["report"]) == report
            assert detail["diffable"] == [france.baseline_run_id]
            missing = client.get("/evals/no-such-eval")
            assert missing.status_code == 404
            assert missing.json()["error"]["type"] == "unknown_eval"
            bad = client.get("/evals", params={"cursor": "not-a-cursor"})
            assert bad.status_code == 400

            page = browser.new_page(viewport={"width": 1280, "height": 900})
            try:
                log_in(page, service.base, TOKEN)
                page.click("#nav-evals")
                rows = page.locator("#evals tbody tr")
                expect(rows).to_have_count(2)
                newest = page.locator(f'#evals tr[data-eval="{report.eval_id}"]')
                expect(newest).to_contain_text("1 regressed")
                expect(newest).to_contain_text("1 flaky")
                expect(newest).to_contain_text("failed")
                expect(newest).to_contain_text("0.75")
                expect(page.locator(f'#evals tr[data-eval="{base.eval_id}"]')).to_contain_text(
                    "passed"
                )
                page.screenshot(path=str(shots / "console-evals-list.png"))
                newest.locator("a").first.click()
                expect(page.locator("#eval-id")).to_have_text(report.eval_id)
                case = page.locator('#eval-cases tr[data-case="france"]')
                expect(case).to_have_attribute("data-baseline", "regressed")
                expect(case.locator(".mark.flaky")).to_have_count(1)
                expect(case.locator(".mark.regressed")).to_contain_text("1.00 → 0.50")
                chips = case.locator(".run-chip")
                expect(chips).to_have_count(2)
                assert [chips.nth(i).get_attribute("href") for i in range(2)] == [
                    f"#/runs/{r.run_id}" for r in france.results
                ]
                expect(case.locator(".run-chip.o-failed")).to_have_count(1)
                expect(case).to_contain_text("output is 'Lyon', expected 'Paris'")
                japan = page.locator('#eval-cases tr[data-case="japan"]')
                expect(japan).to_have_attribute("data-baseline", "unchanged")
                expect(japan.locator("a.diff")).to_have_count(0)
                expect(page.locator("#eval-gates")).to_contain_text(
                    re.compile(r"gate regressions <= 0: FAILED")
                )
                page.set_viewport_size({"width": 420, "height": 900})  # a phone: nothing wider
                wide = page.evaluate("document.documentElement.scrollWidth")
                assert wide <= 420, f"the eval is {wide} px wide"
                page.set_viewport_size({"width": 1280, "height": 900})
                page.screenshot(path=str(shots / "console-evals.png"), full_page=True)

                # A case run opens its run page.
                failed = next(r.run_id for r in france.results if r.outcome == "failed")
                case.locator(f'.run-chip[href="#/runs/{failed}"]').click()
                expect(page.locator("#run-id")).to_have_text(failed)
                expect(page.locator("#run-status")).to_have_text("completed")
                expect(page.locator("#diff")).to_be_hidden()
                page.go_back()
                # The regressed case opens its failed run's diff against the baseline's run.
                page.locator('#eval-cases tr[data-case="france"] a.diff').click()
                expect(page.locator("#run-id")).to_have_text(failed)
                expect(page.locator("#diff-what")).to_have_text(
                    f"compared with the baseline's run {france.baseline_run_id[:12]}"
                )
                expect(page.locator("#diff-first")).to_have_text("First divergence: step answer")
                changes = page.locator('#diff-table tr[data-step="answer"] td.changes')
                expect(changes).to_contain_text("Paris")
                expect(changes).to_contain_text("Lyon")
                expect(page.locator("#diff-summary")).to_contain_text("baseline completed")
            finally:
                page.close()
    assert json.loads(second.stdout)["eval_id"] == report.eval_id
