"""The tools the chat tests offer, and the server's parsers with every option on."""

from __future__ import annotations

from openinfer.frontend.openai.parsers.chat_parsers import ChatParsers

WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "now"}}  # no parameters
TOOLS = [WEATHER, TIME]
ALL_ON = ChatParsers("qwen3", "hermes", enable_auto_tool_choice=True)
