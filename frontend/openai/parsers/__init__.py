"""What a chat model's output text says: its reasoning, its content and its tool calls."""
