//! Integration tests against the real RabbitMQ and PostgreSQL. Each test has
//! its own vhost and database. Tests named `serial_*` disturb shared services
//! (a broker restart, a database stop) and run alone (see deploy/local/test.sh).

mod batch;
mod console;
mod contention;
mod dedup;
mod deploy;
mod direct;
mod dlq;
mod effect_holds;
mod effect_reports;
mod effects;
mod enqueue;
mod entities;
mod failfast;
mod failover;
mod forged_marker;
mod gaps;
mod guest;
mod handler;
mod handoff;
mod holds;
mod hostile;
mod interleave;
mod limits;
mod metrics;
mod nodelay;
mod nodes;
mod operator_loop;
mod ops;
mod outside;
mod overdue;
mod partitions;
mod pipeline;
mod poison;
mod privilege;
mod raw_amqp;
mod recovery;
mod relay;
mod replicas;
mod retention;
mod ring;
mod rust_handler;
mod schema;
mod secrets;
mod shard_isolation;
mod shrink_race;
mod silence;
mod taken_ids;
mod tooling;
mod topology;
mod traces;
mod words;

use urutan_testkit::fixtures as common;
use urutan_testkit::{proxy, scratch, wire};
