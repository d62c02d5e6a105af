"""AWS Bedrock's Converse API: the request, the answer, and ConverseStream's binary event stream."""
