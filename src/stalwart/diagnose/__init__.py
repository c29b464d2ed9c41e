"""Turning symptoms into incidents: cross-layer rules, seams, stragglers, detector precision.

Every function here is pure: observations, config and ``now`` in, a decision with a reason out
(docs/diagnosis.md). What the agent calls:

- ``pipeline.incidents_from_events(events, now, extra=signals)``: one :class:`incident.Incident`
  per communication failure or hang, naming the real cause (``cross_layer`` rules from ``rules.yaml``);
- ``seams.cooling_seams(...)`` and ``seams.blast_radius(...)``: cooling-loop and shared-cause
  incidents, and which faulty nodes to drain (topology from ``topology.load_topology``, facility
  signals from ``facility.load_facility_file`` / ``facility.fetch_prometheus``);
- ``straggler.relative_stragglers(steps)`` then ``straggler_action.decide_straggler(case, work, now)``;
  ``straggler_action.straggler_gate(mode, stats)``: whether an exclusion is carried out this attempt;
- ``precision.detector_stats(events)``, ``precision.precision_gate(stats)``, ``precision.precision_table``;
- ``watchers.silent_watchers(sources, now)``; ``route_around.route_incident(incident, hca, env)``;
- ``hang.attribute_hang(positions, now, timeout_s)``: the culprit of a hang;
- ``root_cause.classify`` / ``component_class`` and ``lemon.lemon_scores`` (moved from launch/ and account/).

Modules are imported on use; importing the package costs nothing.
"""
