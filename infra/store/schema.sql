-- dsec history tables. Created idempotently at start; {ttl_days} is the retention.
-- Every table: day partitions, a TTL, and a deduplication window so that a replayed
-- sink batch (same deduplication token) is not written twice. The raw sample tables
-- (raw_step, raw_episode, …) and the raw_metrics view over them are made from the
-- sample schemas by infra/store/clickhouse.py, so that they always match the wire.

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
    command_time    Nullable(DateTime64(3, 'UTC')),
    requested       Nullable(String),
    in_force        Nullable(String)
)
ENGINE = MergeTree
PARTITION BY toDate(event_time)
ORDER BY (job_id, node_id, worker_id, event_time)
TTL toDateTime(event_time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;

-- The setting a command asked for and the one the worker's loop runs with; a store made
-- before results carried them gains the columns (empty for its older rows).
ALTER TABLE actuation_results ADD COLUMN IF NOT EXISTS requested Nullable(String);
ALTER TABLE actuation_results ADD COLUMN IF NOT EXISTS in_force Nullable(String);

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
    stage           UInt8,
    actuation_id    String,
    detail          String
)
ENGINE = MergeTree
PARTITION BY toDate(event_time)
ORDER BY (policy_name, event_time)
TTL toDateTime(event_time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;
-- stores made before the stage had a column of its own
ALTER TABLE policy_decisions ADD COLUMN IF NOT EXISTS stage UInt8 AFTER decision;
-- the alert a decision raised or ended, and the GPU its features came from
ALTER TABLE policy_decisions ADD COLUMN IF NOT EXISTS alert String DEFAULT '';
ALTER TABLE policy_decisions ADD COLUMN IF NOT EXISTS gpu_uuid LowCardinality(String) DEFAULT '';
ALTER TABLE policy_decisions ADD COLUMN IF NOT EXISTS gpu_model LowCardinality(String) DEFAULT '';
-- the pool of the worker (or of the fleet feature event's scope)
ALTER TABLE features ADD COLUMN IF NOT EXISTS pool LowCardinality(String) DEFAULT '';

-- Each change of a policy alert (firing, resolved), as the alert notifier announced it.
CREATE TABLE IF NOT EXISTS alerts
(
    event_time      DateTime64(3, 'UTC'),
    event_id        String,
    fingerprint     String,
    status          LowCardinality(String),
    alertname       String,
    policy_name     LowCardinality(String),
    policy_version  UInt32,
    job_id          LowCardinality(String),
    node_id         LowCardinality(String),
    worker_id       LowCardinality(String),
    pool            LowCardinality(String),
    gpu_uuid        LowCardinality(String),
    starts_at       DateTime64(3, 'UTC'),
    ends_at         Nullable(DateTime64(3, 'UTC')),
    labels          String,
    annotations     String
)
ENGINE = MergeTree
PARTITION BY toDate(event_time)
ORDER BY (policy_name, fingerprint, event_time)
TTL toDateTime(event_time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;

-- Each change of a GPU's health: degraded since when, why and by which signal, or healthy
-- again (the latest row per GPU is its state).
CREATE TABLE IF NOT EXISTS gpu_health
(
    event_time      DateTime64(3, 'UTC'),
    event_id        String,
    gpu_uuid        LowCardinality(String),
    gpu_model       LowCardinality(String),
    state           LowCardinality(String),
    since           DateTime64(3, 'UTC'),
    signal          LowCardinality(String),
    reason          String,
    policy_name     LowCardinality(String),
    job_id          LowCardinality(String),
    node_id         LowCardinality(String),
    worker_id       LowCardinality(String)
)
ENGINE = MergeTree
PARTITION BY toDate(event_time)
ORDER BY (gpu_uuid, event_time)
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

CREATE TABLE IF NOT EXISTS gpu_profiles
(
    event_time      DateTime64(3, 'UTC'),
    event_id        String,
    gpu_uuid        LowCardinality(String),
    gpu_model       LowCardinality(String),
    job_id          LowCardinality(String),
    node_id         LowCardinality(String),
    worker_id       LowCardinality(String),
    regime          LowCardinality(String),
    delta_bytes     Float64,
    delta_s         Float64,
    thermal_throttle_events UInt32,
    bandwidth_jitter Float64,
    samples         UInt64
)
ENGINE = ReplacingMergeTree(event_time)
PARTITION BY toDate(event_time)
ORDER BY (gpu_uuid, worker_id, regime)
TTL toDateTime(event_time) + INTERVAL {ttl_days} DAY;

CREATE TABLE IF NOT EXISTS sink_offsets
(
    consumer_group  LowCardinality(String),
    topic           LowCardinality(String),
    partition       UInt32,
    next_offset     UInt64,
    updated_at      DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY (consumer_group, topic, partition);

-- Hourly roll-ups, kept by materialized views as rows arrive.
CREATE TABLE IF NOT EXISTS features_hourly
(
    hour        DateTime('UTC'),
    job_id      LowCardinality(String),
    worker_id   LowCardinality(String),
    feature     LowCardinality(String),
    value_avg   AggregateFunction(avg, Float64),
    value_min   AggregateFunction(min, Float64),
    value_max   AggregateFunction(max, Float64),
    events      AggregateFunction(count)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(hour)
ORDER BY (job_id, feature, worker_id, hour)
TTL hour + INTERVAL {ttl_days} DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS features_hourly_mv TO features_hourly AS
SELECT toStartOfHour(event_time) AS hour, job_id, worker_id, feature,
       avgState(value) AS value_avg, minState(value) AS value_min,
       maxState(value) AS value_max, countState() AS events
FROM features
GROUP BY hour, job_id, worker_id, feature;

CREATE TABLE IF NOT EXISTS actuations_hourly
(
    hour        DateTime('UTC'),
    job_id      LowCardinality(String),
    policy_name LowCardinality(String),
    action      LowCardinality(String),
    actuations  UInt64
)
ENGINE = SummingMergeTree
PARTITION BY toYYYYMM(hour)
ORDER BY (job_id, policy_name, action, hour)
TTL hour + INTERVAL {ttl_days} DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS actuations_hourly_mv TO actuations_hourly AS
SELECT toStartOfHour(event_time) AS hour, job_id, policy_name, action, count() AS actuations
FROM actuations
GROUP BY hour, job_id, policy_name, action;

-- What the control plane itself costs: each service process's CPU time since it started
-- and its resident memory, every 30 s (DSEC_USAGE_REPORT_INTERVAL_S).
CREATE TABLE IF NOT EXISTS process_usage
(
    event_time      DateTime64(3, 'UTC'),
    event_id        String,
    service         LowCardinality(String),
    host            LowCardinality(String),
    pid             UInt32,
    started_at      DateTime64(3, 'UTC'),
    cpu_s           Float64,
    rss_bytes       UInt64
)
ENGINE = MergeTree
PARTITION BY toDate(event_time)
ORDER BY (service, host, started_at, event_time)
TTL toDateTime(event_time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;
