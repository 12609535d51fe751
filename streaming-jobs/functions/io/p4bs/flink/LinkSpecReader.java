package io.p4bs.flink;

import java.io.IOException;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;

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
 * optimizer's: the link's [[links]] entry as JSON, of which the job reads only the policy, for
 * the optimizer feed, on demand: {@link #policy}). One reader per function instance; not
 * thread-safe.
 */
final class LinkSpecReader extends AvroReader {
  static final String MALFORMED_METRIC = "malformed_link_specs";
  static final String WHAT = "link spec record";
  /** Specs whose config names no policy the job can read (their links get every window). */
  static final String NO_POLICY_METRIC = "link_specs_without_policy";
  static final String NO_POLICY_WHAT = "link spec's policy (the link gets every window)";
  /** The longest policy name taken; a name is of letters, digits, _ and - (as the config's). */
  static final int POLICY_MAX = 64;

  private static final ObjectMapper JSON = new ObjectMapper();
  /** The SQL type of a spec as NewestLinkSpec gives it and LinkMetrics takes it. */
  static final String SPEC_TYPE =
      "ROW<ts_ns BIGINT, removed BOOLEAN, capacity_bps BIGINT, weight_loss DOUBLE,"
          + " weight_delay DOUBLE, max_loss DOUBLE, max_queue_delay_ns BIGINT, policy STRING>";

  long tsNs;
  boolean removed;
  LinkSettings settings;
  private int configStart, configLength;

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
    configLength = readStringLength();
    configStart = pos - configLength;
    end();
    settings =
        LinkSettings.of(capacityBps, weightLoss, weightDelay, maxLoss, maxQueueDelayNs, null);
  }

  /**
   * The policy the last record's config names (its "policy", a name of letters, digits, _ and -),
   * or a Malformed saying why there is none: config not JSON, not an object, no such name.
   */
  String policy() throws Malformed {
    JsonNode config;
    try {
      config = JSON.readTree(bytes, configStart, configLength);
    } catch (IOException e) {
      String why = String.valueOf(e.getMessage()).lines().findFirst().orElse("");
      throw new Malformed("config is not JSON: " + why);
    }
    JsonNode policy = config == null ? null : config.get("policy");
    if (policy == null || !policy.isTextual()) {
      throw new Malformed("config names no policy");
    }
    String name = policy.textValue();
    if (!name.matches("[A-Za-z0-9_-]{1," + POLICY_MAX + "}")) {
      String shown = name.length() > 80 ? name.substring(0, 80) + "..." : name;
      throw new Malformed("policy '" + shown + "' is not a policy name");
    }
    return name;
  }
}
