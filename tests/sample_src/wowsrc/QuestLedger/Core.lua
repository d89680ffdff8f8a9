local ADDON, ns = ...
local QuestLedger = {}
ns.QuestLedger = QuestLedger

local SCHEMA = 3
local handlers = {}

function QuestLedger:RegisterEvent(event, fn)
	handlers[event] = fn
end

-- Schema 2 -> 3: the party cache moves from profile.partyCache to profile.groups.
local function Migrate(profile)
	if (profile.schema or 1) < 3 then
		profile.groups = profile.partyCache or {}
		profile.partyCache = nil
		profile.schema = 3
	end
end

function QuestLedger:OnLogin()
	self.db = QuestLedgerDB.profiles[QuestLedgerDB.profileKeys[ns.playerKey]]
	Migrate(self.db)
end

-- (lines 30-80 elided in this synthetic sample: frame creation and slash commands)

function QuestLedger:FireEvent(event, ...)
	local fn = handlers[event]
	if fn then
		fn(self, ...)
	end
end

local frame = CreateFrame("Frame")
frame:RegisterEvent("PLAYER_LOGIN")
frame:RegisterEvent("PLAYER_ENTERING_WORLD")
frame:RegisterEvent("GROUP_ROSTER_UPDATE")
frame:RegisterEvent("QUEST_ACCEPTED")
frame:SetScript("OnEvent", function(_, event, ...)
	if event == "PLAYER_LOGIN" then
		QuestLedger:OnLogin()
	end
	QuestLedger:FireEvent(event, ...)
end)
