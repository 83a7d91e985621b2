"""What every layer of the proxy shares: its errors (OpenAI-format responses), deployments parsed
from a LiteLLM `model_list` with their credentials, and the Prometheus metrics. Imports nothing
of the proxy's other subpackages."""
