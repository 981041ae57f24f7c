-- dsec history tables. Created idempotently at start; {ttl_days} is the retention.
-- Every table: day partitions, a TTL, and a deduplication window so that a replayed
-- sink batch (same deduplication token) is not written twice.

CREATE TABLE IF NOT EXISTS raw_metrics
(
    event_time  DateTime64(3, 'UTC'),
    event_id    String,
    batch_id    String,
    job_id      LowCardinality(String),
    node_id     LowCardinality(String),
    worker_id   LowCardinality(String),
    gpu_uuid    LowCardinality(String),
    kind        LowCardinality(String),
    step        Int64,
    values      Map(LowCardinality(String), Float64),
    labels      Map(LowCardinality(String), String),
    ingest_time DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = MergeTree
PARTITION BY toDate(event_time)
ORDER BY (job_id, worker_id, kind, event_time)
TTL toDateTime(event_time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS features
(
    event_time  DateTime64(3, 'UTC'),
    event_id    String,
    job_id      LowCardinality(String),
    node_id     LowCardinality(String),
    worker_id   LowCardinality(String),
    gpu_uuid    LowCardinality(String),
    window      LowCardinality(String),
    feature     LowCardinality(String),
    value       Float64
)
ENGINE = MergeTree
PARTITION BY toDate(event_time)
ORDER BY (job_id, feature, worker_id, event_time)
TTL toDateTime(event_time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS actuations
(
    event_time      DateTime64(3, 'UTC'),
    actuation_id    String,
    expires_at      DateTime64(3, 'UTC'),
    job_id          LowCardinality(String),
    node_id         LowCardinality(String),
    worker_id       LowCardinality(String),
    policy_name     LowCardinality(String),
    policy_version  UInt32,
    action          LowCardinality(String),
    params          String,
    reason          String
)
ENGINE = MergeTree
PARTITION BY toDate(event_time)
ORDER BY (job_id, node_id, worker_id, event_time)
TTL toDateTime(event_time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS actuation_results
(
    event_time      DateTime64(3, 'UTC'),
    event_id        String,
    actuation_id    String,
    job_id          LowCardinality(String),
    node_id         LowCardinality(String),
    worker_id       LowCardinality(String),
    action          LowCardinality(String),
    status          LowCardinality(String),
    detail          String,
    command_time    Nullable(DateTime64(3, 'UTC'))
)
ENGINE = MergeTree
PARTITION BY toDate(event_time)
ORDER BY (job_id, node_id, worker_id, event_time)
TTL toDateTime(event_time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS policy_decisions
(
    event_time      DateTime64(3, 'UTC'),
    event_id        String,
    policy_name     LowCardinality(String),
    policy_version  UInt32,
    job_id          LowCardinality(String),
    node_id         LowCardinality(String),
    worker_id       LowCardinality(String),
    decision        LowCardinality(String),
    actuation_id    String,
    detail          String
)
ENGINE = MergeTree
PARTITION BY toDate(event_time)
ORDER BY (policy_name, event_time)
TTL toDateTime(event_time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS dead_letters
(
    event_time      DateTime64(3, 'UTC'),
    event_id        String,
    source_topic    LowCardinality(String),
    partition       UInt32,
    offset          UInt64,
    reason          String,
    payload         String,
    payload_encoding LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toDate(event_time)
ORDER BY (source_topic, event_time)
TTL toDateTime(event_time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;
