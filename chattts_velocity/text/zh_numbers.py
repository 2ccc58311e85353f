"""Text stage: wetext's own Chinese readings of plain numbers in a short span, without its FST search (~1 ms a span).

A span is what wetext is asked to read (wetext_spans: a clause's digits with three characters of context each side).
It is read here when every character is a mark (，。！？；：、), a character of `NEUTRAL` or part of a plain number
form, and two forms are never side by side (at least one other character between them). The forms, and wetext's
reading of each (slips included):
- a count "25元", "3个", "2小时" (a measure word of MEASURES): a cardinal, the leading 2 of a number said 两 (两元,
  两百人, 两千五百元, 两万个, but 二十元); with a fraction "2.5元", "200.25个": 点 and its digits, and 2 alone is 二;
- a percentage "25%", "5.2%": 百分之 and the number read as with a fraction (百分之二, 百分之两百);
- a year "2024年": four digits said one by one (二零二四年), and with a month and a day: "2024年3月", "2024年3月5日";
  not a span of years ("9400年内", "2024年前": 九千四百年内, two thousand and twenty-four years);
- a month "3月" (1-12) and a date "3月5日" / "3月5号" (day 1-31): cardinals (二月, 十二月, 三十一日; 两日 but 二号);
- a number of up to four digits alone, before a mark (one not followed by a digit: "25，3" is 两百五十三) or at the end
  of the span ("有25，"): read as with a fraction (二, 两百), the service numbers of SPECIAL digit by digit (幺幺零);
  a longer one is wetext's (it reads "12345" as 幺二三四五 but "12346" as 一万二千三百四十六);
- an hour "3点" (0-24) and "3点30分": 二点, 三点零五分, 二点两分. Not a clock time "7:35": wetext reads it as a
  time or a ratio (七比三五) by the characters around it.
Integers have no leading zero ("0" alone is one) and at most MAX_DIGITS digits (wetext says 亿 from nine).
`NEUTRAL` holds characters wetext was measured never to join with a number: tests/text/test_zh_numbers.py reads
every one on each side of every form through wetext itself (not 约: "约2元" is 约二元). Anything else is wetext's.
"""
from __future__ import annotations

import re

MAX_DIGITS = 8  # below 亿
MAX_FRACTION = 6  # digits after the point
MARKS = frozenset("，。！？；：、")
NEUTRAL = frozenset(
    "内的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定"
    "行学法所民得经之进着等部度家电力里如水化高自理起小物现实加量都体制机当使点从业本去把性好应开它合还因由其些然前外"
    "天政日那社义事平形相全表间样与关各重新线数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军"
    "很情者最立代想已通并提直题党程展果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计"
    "别她手角期根论运农指几区强放决西被干做必战先回则任取据处队南给色光门即保治北造规热领海口东导器压志世金增争济阶油"
    "思术极交受联什认共权收证改清己美再采转更单风切打白教速花带安场身车例真务具每目至达走积示议声报斗完类离华名确才科"
    "张信马节话米整空元况今集温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近"
    "矿周委素技备半办青省列习响支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王"
    "按格养易置派层片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严龙飞")
# measure words after which wetext says a cardinal with 两 (两个, 两百人); not 次 种 倍 台 部 楼 公斤 (二次, 幺幺零次)
MEASURES = ("元", "个", "人", "岁", "天", "米", "名", "本", "家", "件", "只", "条", "位", "辆", "块", "张", "斤", "层",
            "周", "小时", "分钟", "秒")
SPAN_AFTER_YEAR = "内前后来"  # "9400年内", "2024年前": a span of years, read as a cardinal (九千四百年内)
_MONTH = r"(?:[1-9]|1[0-2])月"
_DAY = r"(?:[1-9]|[12]\d|3[01])[日号]"
_NUMBER = rf"(?:0|[1-9]\d{{0,{MAX_DIGITS - 1}}})(?:\.\d{{1,{MAX_FRACTION}}})?"
_FORM = re.compile(
    rf"(?<![\d.:])(?:(?P<date>[1-9]\d{{3}}年(?:{_MONTH}(?:{_DAY})?|(?![{SPAN_AFTER_YEAR}]))|{_MONTH}(?:{_DAY})?)"
    rf"|(?P<hour>1?\d|2[0-4])点(?:(?P<minute>0[1-9]|[1-5]\d|[1-9])分)?"
    rf"|(?P<number>{_NUMBER})(?P<suffix>%|{'|'.join(MEASURES)})|(?P<bare>0|[1-9]\d{{0,3}})(?=[{''.join(MARKS)}](?!\d)|\Z))"
    r"(?![\d.])")
_DATE_PARTS = re.compile(r"(?:(\d+)年)?(?:(\d+)月)?(?:(\d+)([日号]))?")
DIGITS = "零一二三四五六七八九"
PHONE_DIGITS = "零幺二三四五六七八九"
SPECIAL = frozenset({"110", "111", "112", "114", "119", "120", "122"})  # 幺幺零: measured over all of 0-9999
_PLACES = ("千", "百", "十", "")


def read_zh_span(text: str) -> str | None:
    """wetext's reading of `text`, or None when `text` holds anything but neutral characters, marks and forms."""
    out, start = [], 0
    for m in _FORM.finditer(text):
        between = text[start:m.start()]
        if (start and not between) or not _plain(between):
            return None
        out += [between, _form_reading(m)]
        start = m.end()
    if not out or not _plain(text[start:]):
        return None
    return "".join(out) + text[start:]


def _plain(text: str) -> bool:
    return all(c in NEUTRAL or c in MARKS for c in text)


def _form_reading(m: re.Match[str]) -> str:
    if m.group("number") is not None:
        return _number_reading(m.group("number"), m.group("suffix"))
    if m.group("bare") is not None:
        bare = m.group("bare")
        if bare in SPECIAL:
            return "".join(PHONE_DIGITS[int(d)] for d in bare)
        return cardinal(int(bare), liang=bare != "2")
    if m.group("hour") is not None:
        minute = m.group("minute")
        return cardinal(int(m.group("hour"))) + "点" + (_zero(minute) + cardinal(int(minute), liang=True) + "分"
                                                       if minute else "")
    return _date_reading(m.group("date"))


def _number_reading(number: str, suffix: str) -> str:
    whole, _, fraction = number.partition(".")
    said = cardinal(int(whole), liang=whole != "2" or not (fraction or suffix == "%")) + _fraction(fraction)
    return "百分之" + said if suffix == "%" else said + suffix


def _date_reading(date: str) -> str:
    parts = _DATE_PARTS.fullmatch(date)
    assert parts is not None  # _FORM's date is a year, month and day
    year, month, day, day_mark = parts.groups()
    said = "".join(DIGITS[int(d)] for d in year) + "年" if year else ""
    if month:
        said += cardinal(int(month)) + "月"
    if day:
        said += cardinal(int(day), liang=day_mark == "日") + day_mark
    return said


def _fraction(digits: str) -> str:
    return "点" + "".join(DIGITS[int(d)] for d in digits) if digits else ""


def _zero(minute: str) -> str:
    return "零" if len(minute) == 2 and minute[0] == "0" else ""


def cardinal(n: int, liang: bool = False) -> str:
    """wetext's Chinese cardinal below 亿: 十二 (not 一十二) at the start, 一千零一十 inside, one 零 for a run of zeros;
    with `liang` a leading 2 that is not a ten is 两 (两, 两百, 两千, 两万, 两千万; 二十)."""
    if n == 0:
        return "零"
    high, low = divmod(n, 10_000)
    if not high:
        said = _group(low)
    else:
        said = _group(high) + "万" + ("" if not low else ("零" if low < 1000 else "") + _group(low))
    if said.startswith("一十"):
        said = said[1:]
    if liang and said.startswith("二") and not said.startswith("二十"):
        said = "两" + said[1:]
    return said


def _group(n: int) -> str:
    """0 < n < 10,000 in full ("一千零一十"), one 零 for a run of zeros inside."""
    said, zero = "", False
    for digit, place in zip(f"{n:04d}", _PLACES, strict=True):
        if digit == "0":
            zero = bool(said)
        else:
            said += ("零" if zero else "") + DIGITS[int(digit)] + place
            zero = False
    return said
