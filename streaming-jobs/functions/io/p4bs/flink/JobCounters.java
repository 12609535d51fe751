package io.p4bs.flink;

import org.apache.flink.metrics.Counter;
import org.apache.flink.table.functions.FunctionContext;

/**
 * The metrics job's own counters, all in one metric group, "p4bs", so that a metrics reporter
 * names them apart from Flink's: Flink's Prometheus reporter serves
 * flink_taskmanager_job_task_operator_p4bs_malformed_link_counters (labels job_name,
 * operator_name, subtask_index, ...), and the REST API lists them as "p4bs.<name>".
 */
final class JobCounters {
  static final String GROUP = "p4bs";

  private JobCounters() {}

  /** The counter `name` of the function's operator, in the p4bs group (made once, then reused). */
  static Counter counter(FunctionContext context, String name) {
    return context.getMetricGroup().addGroup(GROUP).counter(name);
  }
}
