"""The OpenAI Responses API: /v1/responses, served as a chat completions request; output items, stream events and
the stored responses behind previous_response_id."""
