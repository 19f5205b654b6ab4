"""The push API's body, judged: its pydantic models with the configured limits, the rules on step values, and
the values a push carries. The rules service stores what they accept; the agent's relay checks with them what it
forwards, so a push is judged by one piece of code whichever way it travels (docs/rules-api.md)."""
