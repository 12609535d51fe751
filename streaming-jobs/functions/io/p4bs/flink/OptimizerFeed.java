package io.p4bs.flink;

import java.nio.charset.StandardCharsets;
import java.util.Collection;
import java.util.Set;
import java.util.zip.CRC32;

/**
 * Which windows go into the optimizer feed (streaming-jobs/README.md, config [metrics]
 * optimizer_feed): every window of a link whose policy needs every window; for a link whose
 * policy is one of the thinned ones (policies that decide on the window in hand alone, from its
 * SRTT and N), only a window that can move such a decision, and a heartbeat so that the
 * optimizer still hears from a steady link and a slow drift is decided at most a heartbeat late.
 * Pure and apart from Flink, so that tests/java/OptimizerFeedRule.java can run it; the Python
 * twin tests/feedrule.py checks the job's output against it.
 */
public final class OptimizerFeed {
  final double deadband;
  final long heartbeatNs;
  private final Set<String> thinnedPolicies;

  /**
   * @param deadband relative move of SRTT or RTT_min from the previous window that passes a window
   * @param heartbeatNs a window holding in (start, end] one of the link's heartbeats, a whole
   *     multiple of this shifted by the link's offset ({@link #heartbeatOffsetNs}), passes
   * @param thinnedPolicies the policies whose links get only the windows that matter
   */
  public OptimizerFeed(double deadband, long heartbeatNs, Collection<String> thinnedPolicies) {
    if (!(deadband >= 0 && deadband < 1) || heartbeatNs <= 0) {
      throw new IllegalArgumentException(
          "feed deadband " + deadband + " not in [0, 1) or heartbeat " + heartbeatNs + " <= 0");
    }
    this.deadband = deadband;
    this.heartbeatNs = heartbeatNs;
    this.thinnedPolicies = Set.copyOf(thinnedPolicies);
  }

  /** Whether a link of this policy (null: not known, so every window) gets a thinned feed. */
  public boolean thins(String policy) {
    return policy != null && thinnedPolicies.contains(policy);
  }

  /**
   * Whether a thinned link's window can matter to its policy. The previous values are those of
   * the link's previous window out (SRTT and RTT_min null where it had none); {@code first}: the
   * link has no previous window.
   */
  public boolean passes(
      String linkId,
      boolean first,
      int previousLongFlows,
      int longFlows,
      Long previousSrttNs,
      Long srttNs,
      Long previousRttMinNs,
      Long rttMinNs,
      boolean change,
      boolean alert,
      long startNs,
      long endNs) {
    return first
        || longFlows != previousLongFlows
        || moved(previousSrttNs, srttNs)
        || moved(previousRttMinNs, rttMinNs)
        || change
        || alert
        || heartbeat(linkId, startNs, endNs);
  }

  /**
   * Where in the heartbeat period a link's heartbeats fall: its id's CRC-32 modulo the period.
   * The links' heartbeats spread over the period instead of all coming out in one window, so
   * that the optimizer is handed a steady load rather than every link at once.
   */
  private long heartbeatOffsetNs(String linkId) {
    CRC32 crc = new CRC32();
    crc.update(linkId.getBytes(StandardCharsets.UTF_8));
    return Math.floorMod(crc.getValue(), heartbeatNs);
  }

  /** Present in one window and not the other, or moved by more than the deadband of the first. */
  private boolean moved(Long previous, Long now) {
    if (previous == null || now == null) {
      return (previous == null) != (now == null);
    }
    return Math.abs(now - previous) > deadband * previous;
  }

  /** The window (start, end] holds one of the link's heartbeats. */
  private boolean heartbeat(String linkId, long startNs, long endNs) {
    long offset = heartbeatOffsetNs(linkId);
    return Math.floorDiv(endNs - offset, heartbeatNs)
        > Math.floorDiv(startNs - offset, heartbeatNs);
  }
}
