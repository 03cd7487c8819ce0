"""What crosses memprobe's edges: sizes users type and memprobe prints, files it writes."""
