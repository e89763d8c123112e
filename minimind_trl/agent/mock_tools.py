"""Upstream's six mock tools (d65ef2c `trainer/train_agent.py`), deterministic tables behind tool schemas.

Each mock takes the call's `arguments` and returns upstream's result dict, or raises where upstream's raised
(arguments that are not an object, a value that is not a number, an unhashable argument, an expression that
fails): the caller turns any exception into upstream's error observation. What the mocks answer:

* `calculate_math(expression)`: `{"result": str(value)}` after replacing `^ × ÷ − （ ）` with `** * / - ( )`;
  the value comes from `safe_math.evaluate`, not from `eval` (upstream's), with the same results on arithmetic;
* `unit_converter(value, from_unit, to_unit)`: `round(float(value) * factor, 4)`, the factor looked up by
  `"{from}_{to}"` lower-cased, 1 for unknown pairs (`celsius_fahrenheit` is x1.8, no +32, as upstream);
* `get_current_weather(location)`: 15 cities, any other gets `22°C`/`晴`; humidity is always `65%`;
* `get_current_time(timezone="Asia/Shanghai")`: 6 zones, any other gets `2025-03-07 14:30:00`;
* `get_exchange_rate(from_currency, to_currency)`: 8 pairs (case-sensitive), any other gets 1.0;
* `translate_text(text, target_language)`: 6 exact pairs, any other text comes back unchanged.

`ARGUMENT_CHECKS` are upstream's `CHECK_ARGS`, which the reward uses to count valid calls: truthiness checks of
the required keys (`get_current_time` accepts anything). Upstream's checks raised `AttributeError` on arguments
that are not an object; here such arguments are simply not valid.
"""

from typing import Any

from .safe_math import evaluate

WEATHER = {
    "北京": ("28°C", "晴"), "上海": ("15°C", "多云"), "广州": ("32°C", "闷热"), "深圳": ("30°C", "晴"),
    "杭州": ("22°C", "阴"), "成都": ("18°C", "小雨"), "武汉": ("25°C", "多云"), "南京": ("20°C", "晴"),
    "西安": ("16°C", "大风"), "重庆": ("26°C", "阴"), "Tokyo": ("12°C", "晴"), "New York": ("8°C", "多云"),
    "London": ("5°C", "小雨"), "Paris": ("10°C", "阴"), "Sydney": ("25°C", "晴朗"),
}  # fmt: skip
DEFAULT_WEATHER = ("22°C", "晴")
HUMIDITY = "65%"
TIMES = {
    "Asia/Shanghai": "2025-03-07 14:30:00", "America/New_York": "2025-03-07 01:30:00",
    "Europe/London": "2025-03-07 06:30:00", "Asia/Tokyo": "2025-03-07 15:30:00",
    "Europe/Paris": "2025-03-07 07:30:00", "Australia/Sydney": "2025-03-07 17:30:00",
}  # fmt: skip
DEFAULT_TIMEZONE = "Asia/Shanghai"
DEFAULT_TIME = "2025-03-07 14:30:00"
EXCHANGE_RATES = {
    ("USD", "CNY"): 7.21, ("EUR", "CNY"): 7.85, ("GBP", "CNY"): 9.12, ("JPY", "CNY"): 0.048,
    ("USD", "EUR"): 0.92, ("USD", "GBP"): 0.79, ("CNY", "JPY"): 20.83, ("AUD", "CNY"): 4.72,
}  # fmt: skip
TRANSLATIONS = {
    ("你好世界", "english"): "Hello World", ("Good morning", "chinese"): "早上好",
    ("今天天气真好", "english"): "The weather is nice today", ("I love programming", "chinese"): "我喜欢编程",
    ("机器学习很有趣", "english"): "Machine learning is interesting", ("Happy birthday", "chinese"): "生日快乐",
}  # fmt: skip
UNIT_FACTORS = {
    "km_miles": 0.621371, "miles_km": 1.60934, "kg_pounds": 2.20462, "pounds_kg": 0.453592,
    "meters_feet": 3.28084, "feet_meters": 0.3048, "celsius_fahrenheit": 1.8, "fahrenheit_celsius": 0.5556,
}  # fmt: skip
MATH_REPLACEMENTS = (("^", "**"), ("×", "*"), ("÷", "/"), ("−", "-"), ("（", "("), ("）", ")"))


def _object(arguments: Any) -> dict:
    if not isinstance(arguments, dict):
        raise TypeError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    return arguments


def calculate_math(arguments: Any) -> dict:
    expression = str(_object(arguments).get("expression", "0"))
    for old, new in MATH_REPLACEMENTS:
        expression = expression.replace(old, new)
    return {"result": str(evaluate(expression))}


def unit_converter(arguments: Any) -> dict:
    arguments = _object(arguments)
    pair = f"{arguments.get('from_unit', '').lower()}_{arguments.get('to_unit', '').lower()}"
    return {"result": round(float(arguments.get("value", 0)) * UNIT_FACTORS.get(pair, 1), 4)}


def get_current_weather(arguments: Any) -> dict:
    location = _object(arguments).get("location")
    temperature, condition = WEATHER.get(location, DEFAULT_WEATHER)
    return {"city": location, "temperature": temperature, "humidity": HUMIDITY, "condition": condition}


def get_current_time(arguments: Any) -> dict:
    timezone = _object(arguments).get("timezone", DEFAULT_TIMEZONE)
    return {"datetime": TIMES.get(timezone, DEFAULT_TIME), "timezone": timezone}


def get_exchange_rate(arguments: Any) -> dict:
    pair = (_object(arguments).get("from_currency"), arguments.get("to_currency"))
    return {"from": pair[0], "to": pair[1], "rate": EXCHANGE_RATES.get(pair, 1.0)}


def translate_text(arguments: Any) -> dict:
    arguments = _object(arguments)
    text = arguments.get("text", "")
    return {"translated_text": TRANSLATIONS.get((arguments.get("text"), arguments.get("target_language")), text)}


def _truthy(*keys: str):
    """Upstream's check: every key has a truthy value (arguments that are not an object fail)."""
    return lambda arguments: isinstance(arguments, dict) and all(arguments.get(key) for key in keys)


def _unit_converter_check(arguments: Any) -> bool:
    """`value` may be 0 but not missing; both units truthy."""
    if not isinstance(arguments, dict):
        return False
    return arguments.get("value") is not None and bool(arguments.get("from_unit")) and bool(arguments.get("to_unit"))


ARGUMENT_CHECKS = {
    "calculate_math": _truthy("expression"),
    "unit_converter": _unit_converter_check,
    "get_current_weather": _truthy("location"),
    "get_current_time": lambda arguments: True,
    "get_exchange_rate": _truthy("from_currency", "to_currency"),
    "translate_text": _truthy("text", "target_language"),
}
MOCKS = {
    "calculate_math": calculate_math,
    "unit_converter": unit_converter,
    "get_current_weather": get_current_weather,
    "get_current_time": get_current_time,
    "get_exchange_rate": get_exchange_rate,
    "translate_text": translate_text,
}


def _schema(name: str, description: str, properties: dict, required: list[str]) -> dict:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


_STRING, _NUMBER = {"type": "string"}, {"type": "number"}
SCHEMAS = {  # upstream's TOOLS, in its order
    "calculate_math": _schema("calculate_math", "计算数学表达式", {"expression": _STRING}, ["expression"]),
    "unit_converter": _schema(
        "unit_converter", "单位换算", {"value": _NUMBER, "from_unit": _STRING, "to_unit": _STRING},
        ["value", "from_unit", "to_unit"],
    ),
    "get_current_weather": _schema("get_current_weather", "获取天气", {"location": _STRING}, ["location"]),
    "get_current_time": _schema(
        "get_current_time", "获取时间", {"timezone": {"type": "string", "default": DEFAULT_TIMEZONE}}, []
    ),
    "get_exchange_rate": _schema(
        "get_exchange_rate", "查询汇率", {"from_currency": _STRING, "to_currency": _STRING},
        ["from_currency", "to_currency"],
    ),
    "translate_text": _schema(
        "translate_text", "翻译文本", {"text": _STRING, "target_language": _STRING}, ["text", "target_language"]
    ),
}  # fmt: skip

__all__ = [
    "ARGUMENT_CHECKS",
    "EXCHANGE_RATES",
    "MOCKS",
    "SCHEMAS",
    "TIMES",
    "TRANSLATIONS",
    "UNIT_FACTORS",
    "WEATHER",
    "calculate_math",
    "get_current_time",
    "get_current_weather",
    "get_exchange_rate",
    "translate_text",
    "unit_converter",
]
