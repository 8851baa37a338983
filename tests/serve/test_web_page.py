"""The demo page in a real headless Chromium (Selenium): translate, then show the heatmap."""

from __future__ import annotations

import shutil

import pytest

from extra_helpers import need_extra

webdriver = need_extra("web-test", "selenium.webdriver")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                reason="needs chromium and chromedriver (apt-get install chromium chromium-driver)")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-extensions", "--no-first-run", "--window-size=1200,900",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def test_translate_and_show_attention(browser, live_server, trained_dir):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from transduce.inference.translator import Translator

    sentence = "the red dog sleeps"
    translator = Translator.load(trained_dir)
    expected = translator.translate([sentence], beam=4)[0]
    source_pieces = translator.tokenizer.pieces(translator.tokenizer.encode(sentence, "src"), "src")
    wait = WebDriverWait(browser, 20)
    browser.get(live_server.url + "/")
    assert browser.title == "transduce"
    browser.find_element(By.ID, "input").send_keys(sentence)
    browser.find_element(By.ID, "translate").click()
    item = wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "#translations li.translation")))
    assert item.find_element(By.CSS_SELECTOR, ".output").text == expected
    item.click()
    table = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#attention table.heatmap")))
    columns = [th.get_attribute("textContent") for th in table.find_elements(By.CSS_SELECTOR, "thead th")][1:]
    rows = [th.get_attribute("textContent") for th in table.find_elements(By.CSS_SELECTOR, "tbody th")]
    assert columns == source_pieces + ["</s>"]                               # source subwords across
    assert rows[-1] == "</s>" and "".join(rows[:-1]).replace("▁", " ").strip() == expected
    cells = table.find_elements(By.CSS_SELECTOR, "tbody td")
    assert len(cells) == len(rows) * len(columns)
    weights = [float(c.get_attribute("data-weight")) for c in cells]
    assert all(0.0 <= w <= 1.0 for w in weights) and max(weights) > 0.3
    assert cells[0].value_of_css_property("background-color").startswith("rgb")
    assert "error" not in browser.find_element(By.ID, "status").get_attribute("class")


def test_the_page_streams_translations(browser, live_server, trained_dir):
    """With "stream" ticked, each translation arrives over /translate_stream (the sse-starlette
    part of the serve extra) and ends as the plain translation."""
    need_extra("serve", "sse_starlette")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from transduce.inference.translator import Translator

    sentences = ["the red dog sleeps", "a small bird sings today"]
    expected = Translator.load(trained_dir).translate(sentences, beam=4)
    browser.get(live_server.url + "/")
    browser.find_element(By.ID, "input").send_keys("\n".join(sentences))
    browser.find_element(By.ID, "stream").click()
    browser.find_element(By.ID, "translate").click()
    WebDriverWait(browser, 20).until(lambda b: "attention" in b.find_element(By.ID, "status").text)
    outputs = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#translations li.translation .output")]
    assert outputs == expected
