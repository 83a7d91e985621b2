"""Client APIs served by the backend's chat completions: OpenAI Responses and Anthropic Messages.

Each API is one `ClientApi` (`responses.RESPONSES`, `messages.MESSAGES`): it turns its request
into a chat request (`chat_request`, raising `BadRequestError` naming the field it cannot map)
and, through `TranslatingSend`, the backend's chat answer (a body, a stream, an error) into its
own. Backends never see the difference: the translation wraps the ASGI `send` they answer on.
Each API's tools map to chat functions (and the model's calls back) in `responses_tools` and
`messages_tools`; the tools the API's own servers run are left out, and named.
"""
