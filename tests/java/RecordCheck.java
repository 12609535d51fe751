package io.p4bs.flink;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;

/**
 * Runs the metrics job's record readers (LinkSpecReader, IntervalReader in the functions jar) on
 * the records of stdin, one a line: "spec KEY VALUE" (a links-topic record: its key's UTF-8 and
 * its value's bytes, each in hex, "-" for none), "policy KEY VALUE" (the policy such a record's
 * config names, as NewestLinkSpec reads it for the optimizer feed), "interval VALUE" or "time
 * VALUE NOW_MS" (the event time IntervalTime gives the record when this host's clock reads
 * NOW_MS). Prints per record "ok" and what was read (a spec's ts_ns, removed, capacity_bps,
 * weights, max_loss, max_queue_delay_ns; a policy; an interval's ts_ns, samples and events; an
 * event time in ms) or "malformed" and the reason. In the readers' package,
 * which they are private to; tests/unit/test_flink_readers.py compiles it against the jar.
 */
public final class RecordCheck {
  private RecordCheck() {}

  public static void main(String[] args) throws IOException {
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    LinkSpecReader specs = new LinkSpecReader();
    IntervalReader intervals = new IntervalReader();
    StringBuilder out = new StringBuilder();
    for (String line = in.readLine(); line != null; line = in.readLine()) {
      String[] f = line.split(" ", -1);
      try {
        if (f[0].equals("spec")) {
          byte[] key = bytes(f[1]);
          specs.read(key == null ? null : new String(key, StandardCharsets.UTF_8), bytes(f[2]));
          LinkSettings s = specs.settings;
          out.append("ok ")
              .append(specs.tsNs)
              .append(' ')
              .append(specs.removed)
              .append(' ')
              .append(s.capacityBps)
              .append(' ')
              .append(s.weightLoss)
              .append(' ')
              .append(s.weightDelay)
              .append(' ')
              .append(s.maxLoss)
              .append(' ')
              .append(s.maxQueueDelayNs);
        } else if (f[0].equals("policy")) {
          byte[] key = bytes(f[1]);
          specs.read(key == null ? null : new String(key, StandardCharsets.UTF_8), bytes(f[2]));
          String policy = specs.policy();
          out.append("ok ").append(policy);
        } else if (f[0].equals("time")) {
          long timeMs = IntervalTime.eventTimeMs(intervals, bytes(f[1]), Long.parseLong(f[2]));
          out.append("ok ").append(timeMs);
        } else {
          intervals.read(bytes(f[1]));
          out.append("ok ")
              .append(intervals.tsNs)
              .append(' ')
              .append(intervals.sampleCount)
              .append(' ')
              .append(intervals.flowEvents.size());
        }
      } catch (AvroReader.Malformed e) {
        out.append("malformed ").append(e.getMessage());
      }
      out.append('\n');
    }
    System.out.print(out);
  }

  private static byte[] bytes(String hex) {
    return hex.equals("-") ? null : HexFormat.of().parseHex(hex);
  }
}
