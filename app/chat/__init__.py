"""The chat page: conversation list, transcript, composer."""
