//! Integration tests against the real RabbitMQ and PostgreSQL. Each test has
//! its own vhost and database. Tests named `serial_*` disturb shared services
//! (a broker restart, a database stop) and run alone (see deploy/local/test.sh).

mod batch;
mod dedup;
mod deploy;
mod direct;
mod dlq;
mod effects;
mod entities;
mod failover;
mod forged_marker;
mod handler;
mod handoff;
mod holds;
mod hostile;
mod interleave;
mod limits;
mod nodelay;
mod nodes;
mod ops;
mod pipeline;
mod poison;
mod privilege;
mod raw_amqp;
mod recovery;
mod relay;
mod replicas;
mod retention;
mod ring;
mod schema;
mod secrets;
mod shard_isolation;
mod shrink_race;
mod silence;
mod tooling;
mod topology;

use urutan_testkit::fixtures as common;
use urutan_testkit::{proxy, scratch, wire};
