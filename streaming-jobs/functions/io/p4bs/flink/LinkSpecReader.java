package io.p4bs.flink;

/**
 * Reads a LinkSpec record of the links topic (schemas/p4bs_schemas/avro/LinkSpec.avsc, Avro
 * binary, the Kafka value's raw bytes) and checks it whole: the key is a link id's shape
 * (LinkSettings.checkLinkId) and the value's link_id is the key, ts_ns > 0, the settings in their
 * ranges (LinkSettings.of), nothing after the last field. Anything else is a Malformed with what
 * was wrong, for the job to count (metric malformed_link_specs) and pass over: the topic is
 * written by whoever may write it, and read from its start at every fresh start of the job.
 *
 * <p>Field order: link_id (string), ts_ns (long), removed (boolean), capacity_bps,
 * max_queue_delay_ns (long), max_loss, weight_loss, weight_delay (double), config (string, the
 * optimizer's). One reader per function instance; not thread-safe.
 */
final class LinkSpecReader extends AvroReader {
  static final String MALFORMED_METRIC = "malformed_link_specs";
  static final String WHAT = "link spec record";
  /** The SQL type of a spec as NewestLinkSpec gives it and LinkMetrics takes it. */
  static final String SPEC_TYPE =
      "ROW<ts_ns BIGINT, removed BOOLEAN, capacity_bps BIGINT, weight_loss DOUBLE,"
          + " weight_delay DOUBLE, max_loss DOUBLE, max_queue_delay_ns BIGINT>";

  long tsNs;
  boolean removed;
  LinkSettings settings;

  void read(String key, byte[] value) throws Malformed {
    LinkSettings.checkLinkId(key);
    start(value);
    String linkId = readString();
    if (!linkId.equals(key)) {
      throw new Malformed("link_id '" + linkId + "' is not the record's key '" + key + "'");
    }
    tsNs = readLong();
    if (tsNs <= 0) {
      throw new Malformed("ts_ns " + tsNs + " is not above 0");
    }
    removed = readBoolean("removed");
    long capacityBps = readLong();
    long maxQueueDelayNs = readLong();
    double maxLoss = readDouble();
    double weightLoss = readDouble();
    double weightDelay = readDouble();
    settings = LinkSettings.of(capacityBps, weightLoss, weightDelay, maxLoss, maxQueueDelayNs);
    readStringLength(); // config: the optimizer's
    end();
  }
}
