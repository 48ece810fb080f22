"""The training stream: documents through the stages into tokens, cut into fixed windows
(`data`) or packed into dynamic batches (`batching`), handed out per rank per step."""
