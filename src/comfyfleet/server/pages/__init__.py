"""The pages people open: the graph editor and what it calls, and the fleet dashboard."""
