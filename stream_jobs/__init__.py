"""Stream jobs: turn the workers' metric stream into features, dead letters and SQL history."""
